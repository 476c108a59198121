/*
 * test_imatrix.c — Check suite for importance matrices (corral/imatrix.h): computing one over the
 * TinyStories sample (what it collects, and that watching the forward pass changes nothing),
 * llama.cpp's GGUF layout written and read (with experts and empty matrices, as llama-imatrix
 * writes them), its older binary format, and the malformed files a reader must refuse.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/imatrix.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/tensor.h"
#include "refdata.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static char tmp_dir[] = "/tmp/corral-test-imatrix-XXXXXX";

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-imatrix-XXXXXX");
}

static const char *tmp_path(const char *name) {
    static char path[8][512];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

static model *load_stories(void) {
    corral_error err;
    model *m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    return m;
}

/* The TinyStories sample tokenized with BOS. Caller frees. */
static int32_t *sample_tokens(const model *m, size_t *n) {
    size_t len;
    char *text = ref_read_file("reference/tinystories-sample.txt", &len);
    ck_assert_ptr_nonnull(text);
    int32_t *ids;
    corral_error err;
    ck_assert_int_eq(prompt_tokenize_text(model_get_tokenizer(m), text, len, &ids, n, &err),
                     CORRAL_OK);
    free(text);
    return ids;
}

static imatrix *compute_stories(uint32_t n_ctx, uint32_t max_chunks, int process_output) {
    model *m = load_stories();
    size_t n;
    int32_t *ids = sample_tokens(m, &n);
    const imatrix_params p = {.n_ctx = n_ctx,
                              .max_chunks = max_chunks,
                              .process_output = process_output,
                              .dataset = "tinystories-sample.txt"};
    corral_error err;
    imatrix *im = imatrix_compute(m, NULL, ids, n, &p, &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    free(ids);
    model_destroy(&m);
    return im;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

/* ---- core ------------------------------------------------------------------------------------ */

/* Over the sample (some 1400 tokens: 11 chunks of 128), an entry for each of the 35 matrices of
 * stories260K's 5 layers, each having seen every token, with positive finite importance; the
 * attention projections share their input, so their importance is the same. */
START_TEST(test_compute_stories) {
    imatrix *im = compute_stories(128, 0, 0);
    ck_assert_uint_eq(imatrix_n_entries(im), 35);
    ck_assert_uint_eq(imatrix_chunk_size(im), 128);
    ck_assert_uint_ge(imatrix_chunk_count(im), 2);
    ck_assert_uint_eq(imatrix_n_datasets(im), 1);
    ck_assert_str_eq(imatrix_dataset(im, 0), "tinystories-sample.txt");
    for (uint32_t i = 0; i + 1 < imatrix_n_entries(im); i++)
        ck_assert(strcmp(imatrix_entry_name(im, i), imatrix_entry_name(im, i + 1)) < 0);
    for (uint32_t i = 0; i < imatrix_n_entries(im); i++) {
        const char *name = imatrix_entry_name(im, i);
        ck_assert(strncmp(name, "blk.", 4) == 0);
        ck_assert_uint_eq(imatrix_entry_tokens(im, name), 128ull * imatrix_chunk_count(im));
        uint64_t n;
        const float *v = imatrix_find(im, name, &n);
        ck_assert_uint_eq(n, strstr(name, "ffn_down") ? 172 : 64);
        for (uint64_t j = 0; j < n; j++) ck_assert(isfinite(v[j]) && v[j] > 0);
    }
    uint64_t nq, nk;
    const float *q = imatrix_find(im, "blk.2.attn_q.weight", &nq);
    const float *k = imatrix_find(im, "blk.2.attn_k.weight", &nk);
    ck_assert(memcmp(q, k, nq * sizeof *q) == 0);
    ck_assert_ptr_null(imatrix_find(im, "output.weight", NULL));
    ck_assert_ptr_null(imatrix_find(im, "token_embd.weight", NULL));
    imatrix_destroy(&im);
    ck_assert_ptr_null(im);
}
END_TEST

/* Watching the matrix products leaves the logits bit for bit as they were. */
static void count_products(void *user, const void *weight, const float *x, int64_t n_tok,
                           int64_t n_in) {
    (void)weight, (void)x, (void)n_in;
    *(int64_t *)user += n_tok;
}

START_TEST(test_observer_changes_nothing) {
    model *m = load_stories();
    corral_error err;
    const int32_t ids[8] = {1, 300, 301, 302, 303, 304, 305, 306};
    float a[8 * 512], b[8 * 512];
    int64_t seen = 0;
    for (int watch = 0; watch < 2; watch++) {
        kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F32, &err);
        model_runner *r = model_runner_new(m, 0, NULL, &err);
        if (watch) model_runner_set_observer(r, count_products, &seen);
        ck_assert_int_eq(model_forward(r, kv, ids, 8, MODEL_LOGITS_ALL, watch ? b : a, &err),
                         CORRAL_OK);
        model_runner_destroy(&r);
        kv_cache_destroy(&kv);
    }
    ck_assert(memcmp(a, b, sizeof a) == 0);
    /* 7 products of 8 tokens in each of 5 layers (Q, K, V counted apiece), and the output. */
    ck_assert_int_eq(seen, 8 * (7 * 5 + 1));
    model_destroy(&m);
}
END_TEST

/* Saved in llama.cpp's layout and read back: the same entries and importance (sums kept in
 * double until written as float: equal to float rounding). */
START_TEST(test_save_load_llama_layout) {
    imatrix *im = compute_stories(64, 3, 1);
    corral_error err;
    ck_assert_ptr_nonnull(imatrix_find(im, "output.weight", NULL)); /* process_output */
    ck_assert_uint_eq(imatrix_chunk_count(im), 3);
    ck_assert_int_eq(imatrix_save(im, tmp_path("im.gguf"), &err), CORRAL_OK);
    gguf_file *f = gguf_open(tmp_path("im.gguf"), &err);
    ck_assert_ptr_nonnull(f);
    gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.type", &s, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(s, "imatrix"));
    uint32_t u;
    ck_assert_int_eq(gguf_get_u32(f, "imatrix.chunk_count", &u, &err), CORRAL_OK);
    ck_assert_uint_eq(u, 3);
    ck_assert_int_eq(gguf_get_u32(f, "imatrix.chunk_size", &u, &err), CORRAL_OK);
    ck_assert_uint_eq(u, 64);
    ck_assert(gguf_str_eq(gguf_array_str(f, (uint64_t)gguf_find_key(f, "imatrix.datasets"), 0),
                          "tinystories-sample.txt"));
    ck_assert_uint_eq(gguf_tensor_count(f), 2ull * imatrix_n_entries(im));
    const gguf_tensor *t0 = gguf_tensor_at(f, 0), *t1 = gguf_tensor_at(f, 1);
    ck_assert(gguf_str_eq(t0->name, "blk.0.attn_k.weight.in_sum2"));
    ck_assert(gguf_str_eq(t1->name, "blk.0.attn_k.weight.counts"));
    ck_assert_uint_eq(t0->n_dims, 1); /* ggml writes [n_in, 1] as 1-D */
    ck_assert_int_eq(t0->ne[0], 64);
    ck_assert_uint_eq(t1->n_dims, 1);
    ck_assert_float_eq(((const float *)t1->data)[0], 192.0f);
    gguf_destroy(&f);

    imatrix *back = imatrix_load(tmp_path("im.gguf"), &err);
    ck_assert_msg(back != NULL, "%s", err.message);
    ck_assert_uint_eq(imatrix_n_entries(back), imatrix_n_entries(im));
    for (uint32_t i = 0; i < imatrix_n_entries(im); i++) {
        const char *name = imatrix_entry_name(im, i);
        ck_assert_str_eq(imatrix_entry_name(back, i), name);
        uint64_t n1, n2;
        const float *a = imatrix_find(im, name, &n1), *b = imatrix_find(back, name, &n2);
        ck_assert_uint_eq(n1, n2);
        for (uint64_t j = 0; j < n1; j++) ck_assert(fabsf(a[j] - b[j]) <= 1e-6f * a[j]);
    }
    imatrix_destroy(&back);
    imatrix_destroy(&im);
}
END_TEST

/* A file as llama-imatrix writes one for a model with experts: a matrix per expert ([n_in, n_mat]
 * sums, [1, n_mat] counts), an expert no token reached (count 0: importance 1, as llama-quantize
 * reads it), and a dense entry. */
START_TEST(test_reads_llama_expert_entries) {
    gguf_builder *b = gguf_builder_new();
    const char *ds[1] = {"calibration.txt"};
    ck_assert_int_eq(gguf_builder_set_str(b, "general.type", "imatrix"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str_array(b, "imatrix.datasets", ds, 1), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_u32(b, "imatrix.chunk_count", 5), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_u32(b, "imatrix.chunk_size", 512), CORRAL_OK);
    const float sums[8] = {10, 20, 30, 40, 5, 6, 7, 8}, counts[2] = {10, 0};
    const float dsums[4] = {4, 8, 12, 16}, dcounts[1] = {4};
    corral_error err;
    const int64_t ne_s[2] = {4, 2}, ne_c[2] = {1, 2}, ne_ds[1] = {4}, ne_dc[1] = {1};
    ck_assert_int_eq(gguf_builder_add_tensor(b, "blk.0.ffn_up_exps.weight.in_sum2", TENSOR_TYPE_F32,
                                             2, ne_s, sums, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "blk.0.ffn_up_exps.weight.counts", TENSOR_TYPE_F32,
                                             2, ne_c, counts, &err),
                     CORRAL_OK);
    /* In the other order: a reader pairs them by name. */
    ck_assert_int_eq(gguf_builder_add_tensor(b, "blk.0.attn_q.weight.counts", TENSOR_TYPE_F32, 1,
                                             ne_dc, dcounts, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "blk.0.attn_q.weight.in_sum2", TENSOR_TYPE_F32, 1,
                                             ne_ds, dsums, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("llama.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    imatrix *im = imatrix_load(tmp_path("llama.gguf"), &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    ck_assert_uint_eq(imatrix_n_entries(im), 2);
    ck_assert_uint_eq(imatrix_chunk_count(im), 5);
    ck_assert_uint_eq(imatrix_chunk_size(im), 512);
    ck_assert_str_eq(imatrix_dataset(im, 0), "calibration.txt");
    uint64_t n;
    const float *e = imatrix_find(im, "blk.0.ffn_up_exps.weight", &n);
    ck_assert_uint_eq(n, 8);
    const float want[8] = {1, 2, 3, 4, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) ck_assert_float_eq(e[i], want[i]);
    const float *d = imatrix_find(im, "blk.0.attn_q.weight", &n);
    ck_assert_uint_eq(n, 4);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(d[i], (float)(i + 1));
    ck_assert_uint_eq(imatrix_entry_tokens(im, "blk.0.attn_q.weight"), 4);
    imatrix_destroy(&im);
}
END_TEST

/* llama-imatrix's older binary format (--output-format dat): values already divided by the count
 * and multiplied by ncall; importance = value / ncall. */
static size_t put_i32(uint8_t *p, int32_t v) {
    memcpy(p, &v, 4);
    return 4;
}

static size_t legacy_file(uint8_t *buf, int truncate_at) {
    size_t o = 0;
    o += put_i32(buf + o, 2);
    const char *names[2] = {"blk.0.attn_v.weight", "blk.1.ffn_down.weight"};
    for (int e = 0; e < 2; e++) {
        o += put_i32(buf + o, (int32_t)strlen(names[e]));
        memcpy(buf + o, names[e], strlen(names[e]));
        o += strlen(names[e]);
        o += put_i32(buf + o, 4); /* ncall */
        o += put_i32(buf + o, 3); /* values */
        for (int j = 0; j < 3; j++) {
            const float v = 4.0f * (float)(e * 3 + j + 1);
            memcpy(buf + o, &v, 4);
            o += 4;
        }
    }
    o += put_i32(buf + o, 7); /* chunks */
    o += put_i32(buf + o, 9);
    memcpy(buf + o, "text.txt!", 9);
    o += 9;
    return truncate_at ? (size_t)truncate_at : o;
}

START_TEST(test_reads_legacy_format) {
    uint8_t buf[512];
    write_bytes(tmp_path("im.dat"), buf, legacy_file(buf, 0));
    corral_error err;
    imatrix *im = imatrix_load(tmp_path("im.dat"), &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    ck_assert_uint_eq(imatrix_n_entries(im), 2);
    ck_assert_uint_eq(imatrix_chunk_count(im), 7);
    ck_assert_str_eq(imatrix_dataset(im, 0), "text.txt!");
    uint64_t n;
    const float *v = imatrix_find(im, "blk.1.ffn_down.weight", &n);
    ck_assert_uint_eq(n, 3);
    for (int j = 0; j < 3; j++) ck_assert_float_eq(v[j], (float)(3 + j + 1));
    /* Saved as GGUF, it reads back the same importance. */
    ck_assert_int_eq(imatrix_save(im, tmp_path("from-dat.gguf"), &err), CORRAL_OK);
    imatrix *g = imatrix_load(tmp_path("from-dat.gguf"), &err);
    ck_assert_ptr_nonnull(g);
    const float *w = imatrix_find(g, "blk.1.ffn_down.weight", &n);
    for (int j = 0; j < 3; j++) ck_assert_float_eq(w[j], v[j]);
    imatrix_destroy(&g);
    imatrix_destroy(&im);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

START_TEST(test_compute_limits) {
    model *m = load_stories();
    size_t n;
    int32_t *ids = sample_tokens(m, &n);
    corral_error err;
    imatrix_params p = {.n_ctx = (uint32_t)(n / 2 + 1)}; /* one chunk only */
    ck_assert_ptr_null(imatrix_compute(m, NULL, ids, n, &p, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "at least 2") != NULL, "%s", err.message);
    p.n_ctx = 4096; /* over the model's 2048 */
    ck_assert_ptr_null(imatrix_compute(m, NULL, ids, n, &p, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    p.n_ctx = 8;
    ck_assert_ptr_null(imatrix_compute(m, NULL, ids, n, &p, &err));
    p = (imatrix_params){.n_ctx = 32, .max_chunks = 2};
    imatrix *im = imatrix_compute(m, NULL, ids, n, &p, &err);
    ck_assert_ptr_nonnull(im);
    ck_assert_uint_eq(imatrix_chunk_count(im), 2);
    ck_assert_uint_eq(imatrix_entry_tokens(im, "blk.0.ffn_up.weight"), 64);
    imatrix_destroy(&im);
    free(ids);
    model_destroy(&m);
    /* imatrix_set's checks. */
    im = imatrix_new();
    float bad[2] = {1, NAN};
    ck_assert_int_eq(imatrix_set(im, "x", bad, 2, 1, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(imatrix_set(im, "x", bad, 1, 0, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(imatrix_set(im, "x", bad, 1, 3, &err), CORRAL_OK);
    ck_assert_int_eq(imatrix_set(im, "x", bad, 1, 5, &err), CORRAL_OK); /* replaces */
    ck_assert_uint_eq(imatrix_n_entries(im), 1);
    ck_assert_uint_eq(imatrix_entry_tokens(im, "x"), 5);
    imatrix_destroy(&im);
    im = imatrix_new();
    ck_assert_int_eq(imatrix_save(im, tmp_path("empty.gguf"), &err), CORRAL_INVALID_ARGUMENT);
    imatrix_destroy(&im);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

static void expect_load_error(const char *path, corral_status status, const char *needle) {
    corral_error err;
    imatrix *im = imatrix_load(path, &err);
    ck_assert_msg(im == NULL, "%s loaded", path);
    ck_assert_msg(err.status == status, "%s: %s", path, err.message);
    ck_assert_msg(strstr(err.message, needle) != NULL, "%s: '%s' lacks '%s'", path, err.message,
                  needle);
}

/* One F32 tensor pair (or a single tensor) in an imatrix-like GGUF file. */
static void write_gguf(const char *path, const char *sums_name, uint32_t sums_type,
                       const float *sums, int64_t n, const char *counts_name, float count) {
    gguf_builder *b = gguf_builder_new();
    corral_error err;
    const int64_t ne[1] = {n}, ne1[1] = {1};
    uint16_t half[16] = {0};
    ck_assert_int_eq(gguf_builder_add_tensor(b, sums_name, sums_type, 1, ne,
                                             sums_type == TENSOR_TYPE_F16 ? (const void *)half
                                                                          : (const void *)sums,
                                             &err),
                     CORRAL_OK);
    if (counts_name)
        ck_assert_int_eq(
            gguf_builder_add_tensor(b, counts_name, TENSOR_TYPE_F32, 1, ne1, &count, &err),
            CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, path, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
}

START_TEST(test_malformed_files) {
    expect_load_error(tmp_path("missing.gguf"), CORRAL_NOT_FOUND, "missing.gguf");
    write_bytes(tmp_path("text.txt"), "hello", 5);
    expect_load_error(tmp_path("text.txt"), CORRAL_FORMAT, "not an importance matrix");
    const float ok[4] = {1, 2, 3, 4}, neg[4] = {1, -2, 3, 4};
    write_gguf(tmp_path("nocounts.gguf"), "a.in_sum2", TENSOR_TYPE_F32, ok, 4, NULL, 0);
    expect_load_error(tmp_path("nocounts.gguf"), CORRAL_FORMAT, "lacks its .counts");
    write_gguf(tmp_path("f16.gguf"), "a.in_sum2", TENSOR_TYPE_F16, ok, 4, "a.counts", 1);
    expect_load_error(tmp_path("f16.gguf"), CORRAL_FORMAT, "not F32");
    write_gguf(tmp_path("neg.gguf"), "a.in_sum2", TENSOR_TYPE_F32, neg, 4, "a.counts", 1);
    expect_load_error(tmp_path("neg.gguf"), CORRAL_FORMAT, "sum 1");
    write_gguf(tmp_path("badcount.gguf"), "a.in_sum2", TENSOR_TYPE_F32, ok, 4, "a.counts", -1);
    expect_load_error(tmp_path("badcount.gguf"), CORRAL_FORMAT, "count 0");
    write_gguf(tmp_path("none.gguf"), "a.weight", TENSOR_TYPE_F32, ok, 4, NULL, 0);
    expect_load_error(tmp_path("none.gguf"), CORRAL_FORMAT, "no importance matrix entries");
    /* 3 sums for 2 counts do not divide. */
    gguf_builder *b = gguf_builder_new();
    corral_error err;
    const int64_t ne3[1] = {3}, ne2[1] = {2};
    const float c2[2] = {1, 1};
    ck_assert_int_eq(gguf_builder_add_tensor(b, "a.in_sum2", TENSOR_TYPE_F32, 1, ne3, ok, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "a.counts", TENSOR_TYPE_F32, 1, ne2, c2, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("divide.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    expect_load_error(tmp_path("divide.gguf"), CORRAL_FORMAT, "3 sums for 2 counts");
    /* The binary format cut anywhere inside an entry. */
    uint8_t buf[512];
    const size_t full = legacy_file(buf, 0);
    for (size_t cut = 1; cut < full - 17; cut += 5) {
        write_bytes(tmp_path("cut.dat"), buf, legacy_file(buf, (int)cut));
        imatrix *im = imatrix_load(tmp_path("cut.dat"), &err);
        ck_assert_msg(im == NULL, "a file cut at %zu of %zu loaded", cut, full);
        ck_assert_int_eq(err.status, CORRAL_FORMAT);
    }
    /* The same entry twice (found by fuzz_imatrix): refused, naming it. */
    {
        uint8_t dup[128];
        size_t o = put_i32(dup, 2);
        for (int e = 0; e < 2; e++) {
            o += put_i32(dup + o, 8);
            memcpy(dup + o, "a.weight", 8);
            o += 8;
            o += put_i32(dup + o, 1); /* ncall */
            o += put_i32(dup + o, 1); /* values */
            memcpy(dup + o, &ok[0], 4);
            o += 4;
        }
        write_bytes(tmp_path("dup.dat"), dup, o);
        expect_load_error(tmp_path("dup.dat"), CORRAL_FORMAT, "entry a.weight appears twice");
    }
    /* A huge entry count with nothing behind it. */
    int32_t huge[2] = {1 << 30, 5};
    write_bytes(tmp_path("huge.dat"), huge, sizeof huge);
    expect_load_error(tmp_path("huge.dat"), CORRAL_FORMAT, "not an importance matrix");
}
END_TEST

static Suite *imatrix_suite(void) {
    Suite *s = suite_create("imatrix");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, tmp_setup, tmp_teardown);
    tcase_add_test(core, test_compute_stories);
    tcase_add_test(core, test_observer_changes_nothing);
    tcase_add_test(core, test_save_load_llama_layout);
    tcase_add_test(core, test_reads_llama_expert_entries);
    tcase_add_test(core, test_reads_legacy_format);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, tmp_setup, tmp_teardown);
    tcase_add_test(limits, test_compute_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, tmp_setup, tmp_teardown);
    tcase_add_test(errors, test_malformed_files);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(imatrix_suite)
