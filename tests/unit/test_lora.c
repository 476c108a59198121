/*
 * test_lora.c — Check suite for LoRA adapters (adapters/lora.h): merged models against
 * llama.cpp's runtime-LoRA references, GGUF and PEFT forms of one adapter giving bit-identical
 * weights, several adapters against an unmerged computation this file does itself, merges into
 * quantized bases within the type's own quantization error, the cache of merged models, merging
 * in f32 and quantizing once (closer to the F32 reference than merging into a quantized base;
 * without adapters, `corral quantize`'s bytes), and one test per kind of bad adapter.
 *
 * Error budgets (the engine-correctness bounds of test_model.c; the references use an F32 KV
 * cache, and so do these runs):
 *   merged model vs runtime-LoRA references (llama.cpp or exact)   F32 1e-3, F16 0.03
 *   top-1 token equal wherever the reference's top-1 margin > 1.0
 *   greedy tokens equal up to the first reference margin below 0.05
 *   merged F32 tensor vs W·x + sum s·(alpha/r)·B(A·x) in double    1e-5 absolute
 *   quantized merge: |dequant(W') - T| <= 1.05·|dequant(quant(T)) - T| + 1e-6·|T|,
 *                    T = dequant(W) + dW (the type's own error on the very same target)
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/image.h"
#include "corral/model.h"
#include "corral/quantize.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"
#include "lora.h"
#include "refdata.h"
#include "safetensors.h"
#include "testutil.h"

#define F32_MAX_ERR         1e-3
#define F16_MAX_ERR         0.03
#define TOP1_MARGIN         1.0
#define GREEDY_MARGIN_FLOOR 0.05
#define UNMERGED_MAX_ERR    1e-5
#define QUANT_ERR_SLACK     1.05

enum { N_VOCAB = 512 };

/* ---- helpers --------------------------------------------------------------------------------- */

static char tmp_dir[] = "/tmp/corral-test-lora-XXXXXX";

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-lora-XXXXXX");
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

/* A deterministic generator for test data (xorshift64*), uniform in [-1, 1). */
static float rnd(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t x = *s * 2685821657736338717ull;
    return (float)((double)(x >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Teacher-forced logits of ids in fast mode with an F32 KV cache. Caller frees. */
static float *run_logits(const char *path, const int32_t *ids, int n) {
    corral_error err;
    model *m = model_load(path, NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    ck_assert_ptr_nonnull(kv);
    ck_assert_ptr_nonnull(r);
    uint32_t nv = model_get_hparams(m)->n_vocab;
    float *logits = malloc((size_t)n * nv * sizeof(float));
    ck_assert_int_eq(model_forward(r, kv, ids, (uint32_t)n, MODEL_LOGITS_ALL, logits, &err),
                     CORRAL_OK);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
    return logits;
}

/* The base model still loads and runs after a failed merge. */
static void assert_base_usable(const char *base) {
    int32_t ids[4] = {1, 300, 301, 302};
    float *l = run_logits(base, ids, 4);
    for (int i = 0; i < 4 * N_VOCAB; i++) ck_assert(isfinite(l[i]));
    free(l);
}

/* ---- crafted adapters ------------------------------------------------------------------------ */

/* One target of a crafted GGUF adapter, with its factors as stored (row-major float). */
typedef struct craft_target {
    char tensor[64];
    uint32_t rank;
    int64_t n_in, n_out;
    int embd; /* llama.cpp's token_embd layout: a (n_vocab x r), b (n_embd x r) */
    float *a; /* linear: r x n_in; embd: n_out x r */
    float *b; /* linear: n_out x r; embd: n_in x r */
} craft_target;

typedef struct craft_adapter {
    const char *arch;
    float alpha;
    craft_target t[32];
    int n;
} craft_adapter;

/* Adds a target for base tensor `tensor` (shape read from the base) with random factors. */
static void craft_add(craft_adapter *c, const gguf_file *base, const char *tensor, uint32_t rank,
                      uint64_t seed) {
    const gguf_tensor *w = gguf_find_tensor(base, tensor);
    ck_assert_msg(w != NULL, "base has no %s", tensor);
    craft_target *t = &c->t[c->n++];
    snprintf(t->tensor, sizeof t->tensor, "%s", tensor);
    t->rank = rank;
    t->n_in = w->ne[0];
    t->n_out = w->ne[1];
    t->embd = strcmp(tensor, "token_embd.weight") == 0;
    size_t na = (size_t)rank * (size_t)(t->embd ? t->n_out : t->n_in);
    size_t nb = (size_t)rank * (size_t)(t->embd ? t->n_in : t->n_out);
    t->a = malloc(na * sizeof(float));
    t->b = malloc(nb * sizeof(float));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < na; i++) t->a[i] = 0.1f * rnd(&s);
    for (size_t i = 0; i < nb; i++) t->b[i] = 0.05f * rnd(&s);
}

static void craft_free(craft_adapter *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->t[i].a);
        free(c->t[i].b);
    }
    c->n = 0;
}

/* Writes the adapter in llama.cpp's GGUF LoRA format with the test's own builder calls.
 * skip_b names a target whose lora_b is left out; b_ne_override replaces one lora_b's shape. */
static void craft_write(const craft_adapter *c, const char *path, const char *skip_b,
                        const int64_t *b_ne_override) {
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_set_str(b, "general.architecture", c->arch), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, "general.type", "adapter"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, "adapter.type", "lora"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_f32(b, "adapter.lora.alpha", c->alpha), CORRAL_OK);
    corral_error err;
    for (int i = 0; i < c->n; i++) {
        const craft_target *t = &c->t[i];
        char na[96], nb[96];
        snprintf(na, sizeof na, "%s.lora_a", t->tensor);
        snprintf(nb, sizeof nb, "%s.lora_b", t->tensor);
        int64_t ne_a[2], ne_b[2];
        if (t->embd) {
            ne_a[0] = t->rank, ne_a[1] = t->n_out;
            ne_b[0] = t->rank, ne_b[1] = t->n_in;
        } else {
            ne_a[0] = t->n_in, ne_a[1] = t->rank;
            ne_b[0] = t->rank, ne_b[1] = t->n_out;
        }
        ck_assert_int_eq(gguf_builder_add_tensor(b, na, TENSOR_TYPE_F32, 2, ne_a, t->a, &err),
                         CORRAL_OK);
        if (skip_b && strcmp(skip_b, t->tensor) == 0) continue;
        if (b_ne_override && i == 0) {
            ne_b[0] = b_ne_override[0];
            ne_b[1] = b_ne_override[1];
        }
        ck_assert_int_eq(gguf_builder_add_tensor(b, nb, TENSOR_TYPE_F32, 2, ne_b, t->b, &err),
                         CORRAL_OK);
    }
    ck_assert_int_eq(gguf_builder_write(b, path, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
}

/* dW[o][i] of a crafted target times `factor`, in double, by the definition: linear
 * sum_k b[o][k]·a[k][i]; llama.cpp's token_embd sum_k a[o][k]·b[i][k]. */
static double craft_delta(const craft_target *t, int64_t o, int64_t i) {
    double d = 0;
    for (uint32_t k = 0; k < t->rank; k++) {
        if (t->embd) {
            d += (double)t->a[o * t->rank + k] * (double)t->b[i * t->rank + k];
        } else {
            d += (double)t->b[o * t->rank + k] * (double)t->a[k * t->n_in + i];
        }
    }
    return d;
}

/* A tensor of a GGUF file dequantized to f32. Caller frees. */
static float *dequant(const gguf_file *f, const char *name) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    ck_assert_msg(t != NULL, "no tensor %s", name);
    const tensor_type_traits *tt = tensor_type_get_traits(t->type);
    size_t row_bytes = tensor_row_size((tensor_type)t->type, t->ne[0]);
    float *x = malloc((size_t)t->ne[0] * (size_t)t->ne[1] * sizeof(float));
    for (int64_t r = 0; r < t->ne[1]; r++) {
        tt->to_float((const uint8_t *)t->data + (size_t)r * row_bytes, x + (size_t)r * t->ne[0],
                     t->ne[0]);
    }
    return x;
}

/* ---- PEFT directories written by the test ------------------------------------------------------
 */

typedef struct st_entry {
    char name[160];
    const char *dtype;
    int64_t shape[2];
    const void *data;
    size_t bytes;
} st_entry;

/* Writes adapter_config.json (config text) and adapter_model.safetensors (entries, contiguous in
 * order) into dir, creating it. */
static void write_peft(const char *dir, const char *config, const st_entry *e, int n) {
    ck_assert(mkdir(dir, 0700) == 0 || file_exists(dir));
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(config, f);
    fclose(f);
    size_t cap = 256 + (size_t)n * 256, len = 0, off = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len,
                                ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                "\"data_offsets\":[%zu,%zu]}",
                                e[i].name, e[i].dtype, (long long)e[i].shape[0],
                                (long long)e[i].shape[1], off, off + e[i].bytes);
        off += e[i].bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(h, 1, len, f);
    for (int i = 0; i < n; i++) fwrite(e[i].data, 1, e[i].bytes, f);
    fclose(f);
    free(h);
}

/* Writes a raw safetensors file (header text as given, then data_len zero bytes). */
static void write_raw_safetensors(const char *dir, const char *header, size_t data_len,
                                  uint64_t claimed_len) {
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t len = claimed_len ? claimed_len : strlen(header);
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)(len >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
}

#define PEFT_CONFIG_PLAIN                                                                        \
    "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], " \
    "\"use_dora\": false, \"use_rslora\": false, \"bias\": \"none\", \"rank_pattern\": {}, "     \
    "\"alpha_pattern\": {}, \"modules_to_save\": null, \"fan_in_fan_out\": false}"

/* ---- the shared adapter ------------------------------------------------------------------------
 */

static const char *const SHARED_GGUF = "lora/stories260K-lora-r8.gguf";
static const char *const SHARED_PEFT = "lora/stories260K-lora-r8-peft";

START_TEST(test_gguf_and_peft_forms_bit_identical) {
    char *base_path = shared("models/stories260K.gguf");
    char *gguf_ad = shared(SHARED_GGUF), *peft_ad = shared(SHARED_PEFT);
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    ck_assert_ptr_nonnull(base);
    lora_adapter *g = lora_adapter_open(gguf_ad, base, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    lora_adapter *p = lora_adapter_open(peft_ad, base, &err);
    ck_assert_msg(p != NULL, "%s", err.message);
    ck_assert_int_eq(lora_adapter_format(g), LORA_FORMAT_GGUF);
    ck_assert_int_eq(lora_adapter_format(p), LORA_FORMAT_PEFT);
    ck_assert_uint_eq(lora_adapter_target_count(g), 35);
    ck_assert_uint_eq(lora_adapter_target_count(p), 35);
    for (uint32_t i = 0; i < 35; i++) {
        lora_target_info a, b;
        ck_assert_int_eq(lora_adapter_target(g, i, &a), CORRAL_OK);
        ck_assert_int_eq(lora_adapter_target(p, i, &b), CORRAL_OK);
        ck_assert_str_eq(a.tensor, b.tensor);
        ck_assert_uint_eq(a.rank, 8);
        ck_assert_uint_eq(b.rank, 8);
        ck_assert(a.scaling == 2.0f && b.scaling == 2.0f); /* alpha 16 / r 8 */
        size_t nl = (size_t)a.n_out * 8, nr = (size_t)a.n_in * 8;
        float *la = malloc(nl * 4), *ra = malloc(nr * 4), *lb = malloc(nl * 4),
              *rb = malloc(nr * 4);
        ck_assert_int_eq(lora_adapter_factors(g, i, la, ra, &err), CORRAL_OK);
        ck_assert_int_eq(lora_adapter_factors(p, i, lb, rb, &err), CORRAL_OK);
        /* The PEFT q/k lora_B, permuted into GGUF row order, equals llama.cpp's conversion. */
        ck_assert_msg(memcmp(la, lb, nl * 4) == 0, "%s: left factors differ", a.tensor);
        ck_assert_msg(memcmp(ra, rb, nr * 4) == 0, "%s: right factors differ", a.tensor);
        free(la), free(ra), free(lb), free(rb);
    }
    /* Without the permutation the q factors would differ: the PEFT file's raw q_proj lora_B
     * is not the GGUF lora_b (so the comparison above is not vacuous). */
    char *st_path = shared("lora/stories260K-lora-r8-peft/adapter_model.safetensors");
    safetensors_file *stf = safetensors_open(st_path, &err);
    ck_assert_ptr_nonnull(stf);
    const safetensors_tensor *raw = safetensors_find_tensor(
        stf, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    gguf_file *gf = gguf_open(gguf_ad, &err);
    const gguf_tensor *gb = gguf_find_tensor(gf, "blk.0.attn_q.weight.lora_b");
    ck_assert_ptr_nonnull(raw);
    ck_assert_ptr_nonnull(gb);
    ck_assert_uint_eq(raw->size, gb->size);
    ck_assert(memcmp(raw->data, gb->data, gb->size) != 0);
    gguf_destroy(&gf);
    safetensors_destroy(&stf);
    free(st_path);
    lora_adapter_destroy(&g);
    lora_adapter_destroy(&p);
    ck_assert_ptr_null(g);

    /* Merged files: every tensor byte-identical. */
    lora_source sg = {gguf_ad, 1.0f}, sp = {peft_ad, 1.0f};
    const char *out_g = tmp_path("merged-gguf.gguf"), *out_p = tmp_path("merged-peft.gguf");
    lora_merge_report rep;
    ck_assert_msg(lora_merge_file(base_path, &sg, 1, out_g, NULL, &rep, &err) == CORRAL_OK, "%s",
                  err.message);
    ck_assert_uint_eq(rep.n_merged_tensors, 35);
    ck_assert_uint_eq(rep.n_tensors, 48);
    ck_assert_msg(lora_merge_file(base_path, &sp, 1, out_p, NULL, NULL, &err) == CORRAL_OK, "%s",
                  err.message);
    gguf_file *mg = gguf_open(out_g, &err), *mp = gguf_open(out_p, &err);
    ck_assert_ptr_nonnull(mg);
    ck_assert_ptr_nonnull(mp);
    ck_assert_uint_eq(gguf_tensor_count(mg), gguf_tensor_count(base));
    int changed = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(mg); i++) {
        const gguf_tensor *a = gguf_tensor_at(mg, i), *b = gguf_tensor_at(mp, i);
        const gguf_tensor *o = gguf_tensor_at(base, i);
        ck_assert(a->size == b->size && a->type == o->type);
        ck_assert_msg(memcmp(a->data, b->data, a->size) == 0, "tensor %.*s differs",
                      (int)a->name.len, a->name.data);
        changed += memcmp(a->data, o->data, a->size) != 0;
    }
    ck_assert_int_eq(changed, 35);
    /* The merged model records its inputs. */
    gguf_str s;
    ck_assert_int_eq(gguf_get_str(mg, LORA_KEY_BASE, &s, &err), CORRAL_OK);
    ck_assert(s.len > 0 && s.data[0] == '/');
    gguf_type et;
    uint64_t count;
    ck_assert_int_eq(gguf_get_array(mg, LORA_KEY_ADAPTERS, &et, &count, &err), CORRAL_OK);
    ck_assert_uint_eq(count, 1);
    gguf_str a0 = gguf_array_str(mg, (uint64_t)gguf_find_key(mg, LORA_KEY_ADAPTERS), 0);
    ck_assert(a0.len > 2 && memcmp(a0.data + a0.len - 2, ":1", 2) == 0);
    gguf_destroy(&mg);
    gguf_destroy(&mp);
    gguf_destroy(&base);
    free(base_path), free(gguf_ad), free(peft_ad);
}
END_TEST

/* llama.cpp's own merge (export-lora) of the shared adapter into the F32 base holds the same
 * weights as corral's, to rounding. */
START_TEST(test_merge_matches_llama_cpp_export) {
    char *base_path = shared("models/stories260K.gguf"), *ad = shared(SHARED_GGUF);
    char *theirs = shared("lora/stories260K-lora-r8-merged-f32.gguf");
    lora_source s = {ad, 1.0f};
    const char *out = tmp_path("m.gguf");
    corral_error err;
    ck_assert_int_eq(lora_merge_file(base_path, &s, 1, out, NULL, NULL, &err), CORRAL_OK);
    gguf_file *a = gguf_open(out, &err), *b = gguf_open(theirs, &err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    double worst = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(b); i++) {
        const gguf_tensor *tb = gguf_tensor_at(b, i);
        if (tb->type != TENSOR_TYPE_F32) continue;
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)tb->name.len, tb->name.data);
        const gguf_tensor *ta = gguf_find_tensor(a, name);
        ck_assert_ptr_nonnull(ta);
        ck_assert_uint_eq(ta->size, tb->size);
        const float *x = ta->data, *y = tb->data;
        for (uint64_t k = 0; k < ta->size / 4; k++) {
            double d = fabs((double)x[k] - (double)y[k]);
            if (d > worst) worst = d;
        }
    }
    printf("  merged vs llama.cpp export-lora (F32): max |d| %.2e\n", worst);
    ck_assert_msg(worst < 1e-6, "max |d| %.3g", worst);
    gguf_destroy(&a);
    gguf_destroy(&b);
    free(base_path), free(ad), free(theirs);
}
END_TEST

/* Merged model logits over the reference ids against the runtime-LoRA references. */
static void check_reference_logits(const char *stem, const char *base_rel, const char *adapter_rel,
                                   float scale, double max_err) {
    char rel[300];
    snprintf(rel, sizeof rel, "reference/%s.ids.txt", stem);
    int32_t ids[64];
    int n = ref_read_ids(rel, ids, 64);
    ck_assert_int_eq(n, 32);
    char *base = shared(base_rel), *ad = shared(adapter_rel);
    lora_source s = {ad, scale};
    const char *out = tmp_path("ref.gguf");
    corral_error err;
    ck_assert_msg(lora_merge_file(base, &s, 1, out, NULL, NULL, &err) == CORRAL_OK, "%s",
                  err.message);
    float *got = run_logits(out, ids, n);
    const char *suffixes[2] = {"logits.f32", "exact.logits.f32"};
    int ok_any = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(rel, sizeof rel, "reference/%s.%s", stem, suffixes[k]);
        size_t cnt;
        float *ref = ref_read_f32(rel, &cnt);
        ck_assert_ptr_nonnull(ref);
        ck_assert_uint_eq(cnt, (size_t)n * N_VOCAB);
        double worst = 0;
        int top1 = 0;
        for (int p = 0; p < n; p++) {
            const float *g = got + (size_t)p * N_VOCAB, *r = ref + (size_t)p * N_VOCAB;
            for (int i = 0; i < N_VOCAB; i++) {
                double d = fabs((double)g[i] - (double)r[i]);
                if (d > worst) worst = d;
            }
            if (ref_top1_margin(r, N_VOCAB) > TOP1_MARGIN &&
                ref_argmax(g, N_VOCAB) != ref_argmax(r, N_VOCAB))
                top1++;
        }
        printf("  %-32s %-6s scale %.2f vs %-16s max |d| %.2e, top-1 mismatches %d\n", stem,
               strstr(adapter_rel, "peft") ? "PEFT" : "GGUF", scale, suffixes[k], worst, top1);
        ok_any |= worst <= max_err && top1 == 0;
        free(ref);
    }
    ck_assert_msg(ok_any, "%s (%s): merged logits outside the %.3g budget", stem, adapter_rel,
                  max_err);
    free(got);
    free(base);
    free(ad);
}

START_TEST(test_merged_logits_match_runtime_references) {
    const char *forms[2] = {SHARED_GGUF, SHARED_PEFT};
    for (int f = 0; f < 2; f++) {
        check_reference_logits("stories260K__lora-r8-s100", "models/stories260K.gguf", forms[f],
                               1.0f, F32_MAX_ERR);
        check_reference_logits("stories260K__lora-r8-s050", "models/stories260K.gguf", forms[f],
                               0.5f, F32_MAX_ERR);
        check_reference_logits("stories260K-f16__lora-r8-s100", "models/stories260K-f16.gguf",
                               forms[f], 1.0f, F16_MAX_ERR);
    }
}
END_TEST

/* Greedy decoding of the merged model from the reference prompt: the same tokens, and so the same
 * text, up to the first step whose reference margin is below GREEDY_MARGIN_FLOOR. */
static void check_greedy(const char *stem, const char *base_rel, float scale) {
    char rel[300];
    int32_t prompt[64], ref[512];
    snprintf(rel, sizeof rel, "reference/%s.greedy.prompt_ids.txt", stem);
    int n_prompt = ref_read_ids(rel, prompt, 64);
    snprintf(rel, sizeof rel, "reference/%s.greedy.ids.txt", stem);
    int n_ref = ref_read_ids(rel, ref, 512);
    ck_assert_int_gt(n_prompt, 0);
    ck_assert_int_gt(n_ref, 0);
    snprintf(rel, sizeof rel, "reference/%s.greedy.margins.txt", stem);
    size_t mlen;
    char *mtext = ref_read_file(rel, &mlen);
    ck_assert_ptr_nonnull(mtext);
    int must_match = n_ref, step = 0;
    for (char *line = strtok(mtext, "\n"); line; line = strtok(NULL, "\n"), step++) {
        int st, tok;
        double mg;
        if (sscanf(line, "%d %d %lf", &st, &tok, &mg) == 3 && mg < GREEDY_MARGIN_FLOOR &&
            must_match == n_ref)
            must_match = step;
    }
    free(mtext);

    char *base = shared(base_rel), *ad = shared(SHARED_GGUF);
    lora_source s = {ad, scale};
    const char *out = tmp_path("greedy.gguf");
    corral_error err;
    ck_assert_int_eq(lora_merge_file(base, &s, 1, out, NULL, NULL, &err), CORRAL_OK);
    model *m = model_load(out, NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    kv_cache *kv = kv_cache_new(m, 512, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    float logits[N_VOCAB];
    ck_assert_int_eq(
        model_forward(r, kv, prompt, (uint32_t)n_prompt, MODEL_LOGITS_LAST, logits, &err),
        CORRAL_OK);
    int32_t got[512];
    int matched = -1;
    for (int i = 0; i < n_ref; i++) {
        got[i] = ref_argmax(logits, N_VOCAB);
        if (matched < 0 && got[i] != ref[i]) matched = i;
        if (i + 1 < n_ref)
            ck_assert_int_eq(model_forward(r, kv, &got[i], 1, MODEL_LOGITS_LAST, logits, &err),
                             CORRAL_OK);
    }
    if (matched < 0) matched = n_ref;
    printf("  greedy %-32s %d of %d tokens equal (must: %d)\n", stem, matched, n_ref, must_match);
    ck_assert_msg(matched >= must_match, "%s: greedy diverges at step %d, before step %d", stem,
                  matched, must_match);
    /* The text of the agreed tokens is a prefix of the reference's text, byte for byte. */
    char text[8192];
    size_t n_text = 0;
    ck_assert_int_eq(tok_decode(model_get_tokenizer(m), got, (size_t)must_match, 0, text,
                                sizeof text, &n_text, &err),
                     CORRAL_OK);
    snprintf(rel, sizeof rel, "reference/%s.greedy.txt", stem);
    size_t ref_len;
    char *ref_text = ref_read_file(rel, &ref_len);
    ck_assert_ptr_nonnull(ref_text);
    ck_assert_uint_le(n_text, ref_len);
    ck_assert_msg(memcmp(text, ref_text, n_text) == 0, "%s: greedy text differs", stem);
    free(ref_text);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
    free(base);
    free(ad);
}

START_TEST(test_merged_greedy_matches_reference) {
    check_greedy("stories260K__lora-r8-s100", "models/stories260K.gguf", 1.0f);
    check_greedy("stories260K__lora-r8-s050", "models/stories260K.gguf", 0.5f);
    check_greedy("stories260K-f16__lora-r8-s100", "models/stories260K-f16.gguf", 1.0f);
}
END_TEST

/* ---- several adapters against an unmerged computation --------------------------------------- */

START_TEST(test_several_adapters_match_unmerged_f32) {
    char *base_path = shared("models/synth-llama-f32.gguf");
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    ck_assert_ptr_nonnull(base);
    /* Three adapters: different ranks, alphas (one 0: llama.cpp then applies the bare scale) and
     * targets, overlapping on blk.0.attn_q. */
    craft_adapter ad[3] = {{.arch = "llama", .alpha = 8.0f},
                           {.arch = "llama", .alpha = 4.0f},
                           {.arch = "llama", .alpha = 0.0f}};
    craft_add(&ad[0], base, "blk.0.attn_q.weight", 4, 1);
    craft_add(&ad[0], base, "blk.1.attn_v.weight", 4, 2);
    craft_add(&ad[1], base, "blk.0.attn_q.weight", 16, 3);
    craft_add(&ad[1], base, "blk.1.ffn_down.weight", 16, 4);
    craft_add(&ad[1], base, "output.weight", 16, 5);
    craft_add(&ad[2], base, "blk.0.ffn_up.weight", 2, 6);
    craft_add(&ad[2], base, "token_embd.weight", 2, 7);
    const float scales[3] = {0.7f, -0.3f, 1.5f};
    lora_source src[3];
    char *paths[3];
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "ad%d.gguf", i);
        paths[i] = strdup(tmp_path(name));
        craft_write(&ad[i], paths[i], NULL, NULL);
        src[i] = (lora_source){paths[i], scales[i]};
    }
    threadpool *pool = threadpool_new(3, &err);
    ck_assert_ptr_nonnull(pool);
    const char *out = tmp_path("multi.gguf");
    lora_merge_report rep;
    ck_assert_msg(lora_merge_file(base_path, src, 3, out, pool, &rep, &err) == CORRAL_OK, "%s",
                  err.message);
    ck_assert_uint_eq(rep.n_merged_tensors, 6);
    gguf_file *merged = gguf_open(out, &err);
    ck_assert_ptr_nonnull(merged);

    /* For each targeted tensor: y = W·x + sum s·(alpha/r)·B(A·x) in double, for random x,
     * against W'·x. */
    const char *tensors[] = {"blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight",
                             "output.weight",       "blk.0.ffn_up.weight", "token_embd.weight"};
    uint64_t seed = 99;
    double worst = 0;
    for (size_t ti = 0; ti < 6; ti++) {
        const gguf_tensor *w = gguf_find_tensor(base, tensors[ti]);
        const gguf_tensor *wm = gguf_find_tensor(merged, tensors[ti]);
        ck_assert_int_eq(wm->type, TENSOR_TYPE_F32);
        int64_t n_in = w->ne[0], n_out = w->ne[1];
        double *x = malloc((size_t)n_in * sizeof *x);
        for (int64_t i = 0; i < n_in; i++) x[i] = rnd(&seed);
        const float *W = w->data, *Wm = wm->data;
        for (int64_t o = 0; o < n_out; o++) {
            double y = 0, ym = 0;
            for (int64_t i = 0; i < n_in; i++) {
                y += (double)W[o * n_in + i] * x[i];
                ym += (double)Wm[o * n_in + i] * x[i];
            }
            for (int a = 0; a < 3; a++) {
                for (int k = 0; k < ad[a].n; k++) {
                    const craft_target *t = &ad[a].t[k];
                    if (strcmp(t->tensor, tensors[ti]) != 0) continue;
                    double f = scales[a] * (ad[a].alpha != 0 ? ad[a].alpha / t->rank : 1.0);
                    /* B(A·x): the low-rank path evaluated as such, not as a delta matrix. */
                    for (uint32_t r = 0; r < t->rank; r++) {
                        double ax = 0;
                        for (int64_t i = 0; i < n_in; i++) {
                            double aval =
                                t->embd ? t->b[i * t->rank + r] : t->a[(size_t)r * n_in + i];
                            ax += aval * x[i];
                        }
                        double bval = t->embd ? t->a[o * t->rank + r] : t->b[o * t->rank + r];
                        y += f * bval * ax;
                    }
                }
            }
            double d = fabs(y - ym);
            if (d > worst) worst = d;
        }
        free(x);
    }
    printf("  three adapters, six tensors: max |W'x - (Wx + sum s(a/r)B(Ax))| = %.2e\n", worst);
    ck_assert_msg(worst <= UNMERGED_MAX_ERR, "max |d| %.3g", worst);
    /* Untargeted tensors are the base's bytes. */
    const gguf_tensor *k0 = gguf_find_tensor(merged, "blk.0.attn_k.weight");
    ck_assert(memcmp(k0->data, gguf_find_tensor(base, "blk.0.attn_k.weight")->data, k0->size) == 0);
    /* Bit-identical whatever the thread count. */
    const char *out1 = tmp_path("multi-1thread.gguf");
    ck_assert_int_eq(lora_merge_file(base_path, src, 3, out1, NULL, NULL, &err), CORRAL_OK);
    gguf_file *m1 = gguf_open(out1, &err);
    for (uint64_t i = 0; i < gguf_tensor_count(m1); i++) {
        ck_assert(memcmp(gguf_tensor_at(m1, i)->data, gguf_tensor_at(merged, i)->data,
                         gguf_tensor_at(m1, i)->size) == 0);
    }
    gguf_destroy(&m1);
    gguf_destroy(&merged);
    threadpool_destroy(&pool);
    for (int i = 0; i < 3; i++) {
        craft_free(&ad[i]);
        free(paths[i]);
    }
    gguf_destroy(&base);
    free(base_path);
}
END_TEST

/* A PEFT adapter with rank_pattern, alpha_pattern, rsLoRA, embeddings and lm_head, on a base
 * with 4 heads / 2 KV heads of 64: checked against deltas this test computes from the README's
 * permutation rule. */
START_TEST(test_peft_patterns_rslora_permutation) {
    char *base_path = shared("models/synth-llama-f32.gguf");
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    ck_assert_ptr_nonnull(base);
    typedef struct {
        const char *module, *gguf;
        int64_t n_in, n_out;
        uint32_t rank;
        double alpha;
        int embd;
        uint32_t groups; /* Q/K permutation head groups, 0 none */
        float *a, *b;
    } peft_t;
    peft_t mods[] = {
        {"model.layers.0.self_attn.q_proj", "blk.0.attn_q.weight", 256, 256, 4, 8, 0, 4, NULL,
         NULL},
        {"model.layers.1.self_attn.q_proj", "blk.1.attn_q.weight", 256, 256, 2, 8, 0, 4, NULL,
         NULL},
        {"model.layers.0.self_attn.k_proj", "blk.0.attn_k.weight", 256, 128, 4, 3, 0, 2, NULL,
         NULL},
        {"model.layers.1.mlp.down_proj", "blk.1.ffn_down.weight", 768, 256, 4, 5, 0, 0, NULL, NULL},
        {"lm_head", "output.weight", 256, 512, 4, 8, 0, 0, NULL, NULL},
        {"model.embed_tokens", "token_embd.weight", 256, 512, 4, 8, 1, 0, NULL, NULL},
    };
    int n_mods = 6;
    st_entry e[12];
    uint64_t seed = 5;
    for (int i = 0; i < n_mods; i++) {
        peft_t *m = &mods[i];
        /* PEFT shapes: linear A (r, n_in), B (n_out, r); embedding A (r, n_vocab), B (n_embd, r).
         */
        int64_t a_rows = m->rank, a_cols = m->embd ? m->n_out : m->n_in;
        int64_t b_rows = m->embd ? m->n_in : m->n_out, b_cols = m->rank;
        m->a = malloc((size_t)(a_rows * a_cols) * 4);
        m->b = malloc((size_t)(b_rows * b_cols) * 4);
        for (int64_t k = 0; k < a_rows * a_cols; k++) m->a[k] = 0.1f * rnd(&seed);
        for (int64_t k = 0; k < b_rows * b_cols; k++) m->b[k] = 0.05f * rnd(&seed);
        const char *sa = m->embd ? "lora_embedding_A" : "lora_A.weight";
        const char *sb = m->embd ? "lora_embedding_B" : "lora_B.weight";
        e[2 * i] = (st_entry){"", "F32", {a_rows, a_cols}, m->a, (size_t)(a_rows * a_cols) * 4};
        e[2 * i + 1] = (st_entry){"", "F32", {b_rows, b_cols}, m->b, (size_t)(b_rows * b_cols) * 4};
        snprintf(e[2 * i].name, sizeof e[0].name, "base_model.model.%s.%s", m->module, sa);
        snprintf(e[2 * i + 1].name, sizeof e[0].name, "base_model.model.%s.%s", m->module, sb);
    }
    const char *dir = tmp_path("peft");
    write_peft(dir,
               "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"use_rslora\":true,"
               "\"rank_pattern\":{\"model.layers.1.self_attn.q_proj\":2},"
               "\"alpha_pattern\":{\"k_pr[o]j\":3,\"layers\\\\.1\\\\.mlp\\\\.d.*\":5},\"target_"
               "modules\":\"all\","
               "\"bias\":\"none\",\"use_dora\":false,\"init_lora_weights\":true}",
               e, 2 * n_mods);
    lora_source s = {dir, 0.8f};
    const char *out = tmp_path("peft-merged.gguf");
    ck_assert_msg(lora_merge_file(base_path, &s, 1, out, NULL, NULL, &err) == CORRAL_OK, "%s",
                  err.message);
    gguf_file *merged = gguf_open(out, &err);
    ck_assert_ptr_nonnull(merged);
    double worst = 0;
    for (int i = 0; i < n_mods; i++) {
        const peft_t *m = &mods[i];
        const float *W = gguf_find_tensor(base, m->gguf)->data;
        const float *Wm = gguf_find_tensor(merged, m->gguf)->data;
        double f = 0.8 * m->alpha / sqrt((double)m->rank);
        for (int64_t o = 0; o < m->n_out; o++) {
            /* Hugging Face row o lands at GGUF row g: within a head of d rows, row j·d/2 + i
             * (first or second half) goes to 2i + j. */
            int64_t g = o;
            if (m->groups) {
                int64_t d = m->n_out / m->groups, h = o / d, r = o % d;
                g = h * d + 2 * (r % (d / 2)) + r / (d / 2);
            }
            for (int64_t c = 0; c < m->n_in; c++) {
                double dw = 0;
                for (uint32_t k = 0; k < m->rank; k++) {
                    if (m->embd) {
                        dw += (double)m->a[(size_t)k * m->n_out + o] * m->b[c * m->rank + k];
                    } else {
                        dw += (double)m->b[o * m->rank + k] * m->a[(size_t)k * m->n_in + c];
                    }
                }
                double d =
                    fabs((double)Wm[g * m->n_in + c] - ((double)W[g * m->n_in + c] + f * dw));
                if (d > worst) worst = d;
            }
        }
    }
    printf("  PEFT rank/alpha patterns, rsLoRA, permutation: max |d| %.2e\n", worst);
    ck_assert_msg(worst < 1e-6, "max |d| %.3g", worst);
    gguf_destroy(&merged);
    for (int i = 0; i < n_mods; i++) free(mods[i].a), free(mods[i].b);
    gguf_destroy(&base);
    free(base_path);
}
END_TEST

/* qwen2 GGUF files keep Hugging Face's row order: a PEFT q_proj/k_proj adapter (here with F16
 * and BF16 factors) is merged without the llama permutation. */
START_TEST(test_peft_qwen2_unpermuted_half_precision) {
    char *base_path = shared("models/synth-qwen2-f32.gguf");
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    ck_assert_ptr_nonnull(base);
    const struct {
        const char *module, *gguf, *dtype;
        int64_t n_in, n_out;
    } mods[2] = {{"model.layers.0.self_attn.q_proj", "blk.0.attn_q.weight", "F16", 256, 256},
                 {"model.layers.1.self_attn.k_proj", "blk.1.attn_k.weight", "BF16", 256, 128}};
    const uint32_t r = 4;
    uint16_t *raw[4];
    float *val[4]; /* the factors' values after rounding to their dtype */
    st_entry e[4];
    uint64_t seed = 11;
    for (int m = 0; m < 2; m++) {
        int64_t rows[2] = {r, mods[m].n_out}, cols[2] = {mods[m].n_in, r};
        for (int h = 0; h < 2; h++) {
            int k = 2 * m + h;
            size_t n = (size_t)(rows[h] * cols[h]);
            raw[k] = malloc(n * 2);
            val[k] = malloc(n * 4);
            for (size_t i = 0; i < n; i++) {
                float x = (h ? 0.05f : 0.1f) * rnd(&seed);
                if (m == 0) {
                    raw[k][i] = tensor_f32_to_fp16(x);
                    val[k][i] = tensor_fp16_to_f32(raw[k][i]);
                } else {
                    raw[k][i] = tensor_f32_to_bf16(x);
                    val[k][i] = tensor_bf16_to_f32(raw[k][i]);
                }
            }
            e[k] = (st_entry){"", mods[m].dtype, {rows[h], cols[h]}, raw[k], n * 2};
            snprintf(e[k].name, sizeof e[k].name, "base_model.model.%s.%s", mods[m].module,
                     h ? "lora_B.weight" : "lora_A.weight");
        }
    }
    const char *dir = tmp_path("qwen-peft");
    write_peft(dir, "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":6}", e, 4);
    lora_source s = {dir, 1.0f};
    const char *out = tmp_path("qwen-merged.gguf");
    ck_assert_msg(lora_merge_file(base_path, &s, 1, out, NULL, NULL, &err) == CORRAL_OK, "%s",
                  err.message);
    gguf_file *merged = gguf_open(out, &err);
    double worst = 0;
    for (int m = 0; m < 2; m++) {
        const float *W = gguf_find_tensor(base, mods[m].gguf)->data;
        const float *Wm = gguf_find_tensor(merged, mods[m].gguf)->data;
        const float *A = val[2 * m], *B = val[2 * m + 1];
        for (int64_t o = 0; o < mods[m].n_out; o++) {
            for (int64_t c = 0; c < mods[m].n_in; c++) {
                double dw = 0;
                for (uint32_t k = 0; k < r; k++)
                    dw += (double)B[o * r + k] * A[(size_t)k * mods[m].n_in + c];
                size_t at = (size_t)(o * mods[m].n_in + c);
                worst = fmax(worst, fabs((double)Wm[at] - ((double)W[at] + 1.5 * dw)));
            }
        }
    }
    printf("  PEFT on qwen2 (F16 and BF16 factors, no permutation): max |d| %.2e\n", worst);
    ck_assert_msg(worst < 1e-6, "max |d| %.3g", worst);
    /* The merged qwen2 model loads and runs. */
    assert_base_usable(out);
    gguf_destroy(&merged);
    for (int k = 0; k < 4; k++) free(raw[k]), free(val[k]);
    gguf_destroy(&base);
    free(base_path);
}
END_TEST

/* ---- quantized bases ---------------------------------------------------------------------------
 */

START_TEST(test_quantized_bases_within_own_quantization_error) {
    const char *types[] = {"q8_0", "q4_0", "q4_k", "q6_k"};
    const char *roles[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                           "ffn_gate", "ffn_up", "ffn_down"};
    for (int ty = 0; ty < 4; ty++) {
        char rel[96];
        snprintf(rel, sizeof rel, "models/synth-llama-%s.gguf", types[ty]);
        char *base_path = shared(rel);
        corral_error err;
        gguf_file *base = gguf_open(base_path, &err);
        ck_assert_ptr_nonnull(base);
        craft_adapter ad = {.arch = "llama", .alpha = 16.0f};
        for (int l = 0; l < 2; l++) {
            for (int r = 0; r < 7; r++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, roles[r]);
                craft_add(&ad, base, name, 8, (uint64_t)(100 * ty + 10 * l + r));
            }
        }
        const char *adp = tmp_path("q.lora.gguf");
        craft_write(&ad, adp, NULL, NULL);
        lora_source s = {adp, 1.0f};
        const char *out = tmp_path("q.merged.gguf");
        ck_assert_msg(lora_merge_file(base_path, &s, 1, out, NULL, NULL, &err) == CORRAL_OK, "%s",
                      err.message);
        gguf_file *merged = gguf_open(out, &err);
        ck_assert_ptr_nonnull(merged);
        double worst_ratio = 0;
        for (int k = 0; k < ad.n; k++) {
            const craft_target *t = &ad.t[k];
            const gguf_tensor *wb = gguf_find_tensor(base, t->tensor);
            const gguf_tensor *wm = gguf_find_tensor(merged, t->tensor);
            ck_assert_int_eq(wm->type, wb->type);
            const tensor_type_traits *tt = tensor_type_get_traits(wb->type);
            float *w = dequant(base, t->tensor), *wmf = dequant(merged, t->tensor);
            size_t n = (size_t)t->n_in * (size_t)t->n_out;
            float *target = malloc(n * sizeof *target), *requant = malloc(n * sizeof *requant);
            void *blocks = malloc(tensor_row_size((tensor_type)wb->type, t->n_in));
            double f = 16.0 / 8.0;
            for (int64_t o = 0; o < t->n_out; o++) {
                for (int64_t i = 0; i < t->n_in; i++) {
                    size_t at = (size_t)o * t->n_in + i;
                    target[at] = (float)((double)w[at] + f * craft_delta(t, o, i));
                }
                /* The type's own error on this very target: quantize, dequantize. */
                tt->from_float(target + (size_t)o * t->n_in, blocks, t->n_in);
                tt->to_float(blocks, requant + (size_t)o * t->n_in, t->n_in);
            }
            double e_merged = 0, e_own = 0, norm = 0, moved = 0;
            for (size_t i = 0; i < n; i++) {
                e_merged += ((double)wmf[i] - target[i]) * ((double)wmf[i] - target[i]);
                e_own += ((double)requant[i] - target[i]) * ((double)requant[i] - target[i]);
                norm += (double)target[i] * target[i];
                moved += ((double)wmf[i] - w[i]) * ((double)wmf[i] - w[i]);
            }
            e_merged = sqrt(e_merged), e_own = sqrt(e_own), norm = sqrt(norm), moved = sqrt(moved);
            ck_assert_msg(e_merged <= QUANT_ERR_SLACK * e_own + 1e-6 * norm,
                          "%s %s: |W' - T| %.4g exceeds the type's own %.4g", types[ty], t->tensor,
                          e_merged, e_own);
            /* The adapter really moved the weights, by more than the quantization noise. */
            ck_assert_msg(moved > e_own, "%s %s: merge moved the weights by only %.3g", types[ty],
                          t->tensor, moved);
            if (e_merged / e_own > worst_ratio) worst_ratio = e_merged / e_own;
            free(w), free(wmf), free(target), free(requant), free(blocks);
        }
        /* The merged model computes something else than the base. */
        int32_t ids[8] = {1, 300, 301, 302, 303, 304, 305, 306};
        float *lb = run_logits(base_path, ids, 8), *lm = run_logits(out, ids, 8);
        double diff = 0;
        for (int i = 0; i < 8 * N_VOCAB; i++) diff = fmax(diff, fabs((double)lb[i] - lm[i]));
        printf(
            "  %-5s 14 tensors: worst |W'-T| / own quantization error %.3f; logits moved by %.3f\n",
            types[ty], worst_ratio, diff);
        ck_assert_msg(diff > 0.05, "%s: merged logits equal the base's (max |d| %.3g)", types[ty],
                      diff);
        free(lb), free(lm);
        gguf_destroy(&merged);
        craft_free(&ad);
        gguf_destroy(&base);
        free(base_path);
    }
}
END_TEST

/* ---- the cache ---------------------------------------------------------------------------------
 */

START_TEST(test_cache_second_load_does_no_merge) {
    char *base = shared("models/stories260K.gguf"), *ad = shared(SHARED_GGUF);
    char *peft = shared(SHARED_PEFT);
    const char *cache = tmp_path("cache/sub");
    lora_source src[2] = {{ad, 1.0f}, {peft, 0.25f}};
    lora_variant_request req = {.base_path = base,
                                .adapters = src,
                                .n_adapters = 1,
                                .cache_dir = cache,
                                .verify = IMAGE_VERIFY_FULL};
    corral_error err;
    lora_variant v1, v2;
    uint64_t merges = lora_merge_count();
    ck_assert_msg(lora_variant_prepare(&req, &v1, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_int_eq(v1.cache_hit, 0);
    ck_assert_int_eq(v1.reason, IMAGE_PROBLEM_MISSING);
    ck_assert(lora_merge_count() == merges + 1);
    ck_assert(strstr(v1.path, cache) == v1.path && strstr(v1.path, v1.fingerprint));

    ck_assert_int_eq(lora_variant_prepare(&req, &v2, &err), CORRAL_OK);
    ck_assert_int_eq(v2.cache_hit, 1);
    ck_assert(lora_merge_count() == merges + 1); /* no merge work */
    ck_assert_str_eq(v1.path, v2.path);
    ck_assert(v2.merge_seconds == 0);
    printf("  cache: first request merged in %.3f s; second found it in %.4f s (verified)\n",
           v1.merge_seconds, v2.lookup_seconds);
    /* The cached model is the merged model. */
    int32_t ids[32];
    ck_assert_int_eq(ref_read_ids("reference/stories260K__lora-r8-s100.ids.txt", ids, 32), 32);
    float *got = run_logits(v2.path, ids, 32);
    size_t cnt;
    float *ref = ref_read_f32("reference/stories260K__lora-r8-s100.logits.f32", &cnt);
    double worst = 0;
    for (size_t i = 0; i < cnt; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
    ck_assert_msg(worst <= F32_MAX_ERR, "cached variant: max |d| %.3g", worst);
    free(got), free(ref);

    /* Every input is part of the key: another scale, another adapter list, a touched file. */
    src[0].scale = 0.5f;
    lora_variant v3;
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 0);
    ck_assert_str_ne(v3.fingerprint, v1.fingerprint);
    req.n_adapters = 2;
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 0);
    ck_assert(lora_merge_count() == merges + 3);
    src[0].scale = 1.0f;
    req.n_adapters = 1;
    /* A copy of the adapter with a new mtime is another input. */
    const char *copy = tmp_path("copy.gguf");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ad, copy);
    ck_assert_int_eq(system(cmd), 0);
    lora_source moved = {copy, 1.0f};
    req.adapters = &moved;
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 0);
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 1);
    struct timespec later[2] = {{0, UTIME_OMIT}, {time(NULL) + 5, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, copy, later, 0), 0);
    char fp_before[17];
    snprintf(fp_before, sizeof fp_before, "%s", v3.fingerprint);
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 0);
    ck_assert_str_ne(v3.fingerprint, fp_before);

    /* A corrupt cached image is detected, reported and rebuilt. */
    req.adapters = src;
    struct stat sb;
    ck_assert_int_eq(stat(v1.path, &sb), 0);
    int fd = open(v1.path, O_RDWR);
    uint8_t c;
    ck_assert_int_eq(pread(fd, &c, 1, sb.st_size - 1000), 1);
    c ^= 0x55;
    ck_assert_int_eq(pwrite(fd, &c, 1, sb.st_size - 1000), 1);
    close(fd);
    uint64_t before = lora_merge_count();
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 0);
    ck_assert_int_eq(v3.reason, IMAGE_PROBLEM_CHECKSUM);
    ck_assert(lora_merge_count() == before + 1);
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_int_eq(v3.cache_hit, 1);
    free(base), free(ad), free(peft);
}
END_TEST

START_TEST(test_cache_trimmed_by_size_lru) {
    char *base = shared("models/stories260K.gguf"), *ad = shared(SHARED_GGUF);
    const char *cache = tmp_path("cache");
    struct stat sb;
    ck_assert_int_eq(stat(base, &sb), 0);
    /* Room for two merged images (each about the base's size), not three. */
    uint64_t limit = (uint64_t)sb.st_size * 2 + (uint64_t)sb.st_size / 2;
    lora_source src = {ad, 1.0f};
    lora_variant_request req = {.base_path = base,
                                .adapters = &src,
                                .n_adapters = 1,
                                .cache_dir = cache,
                                .cache_limit_bytes = limit,
                                .verify = IMAGE_VERIFY_METADATA};
    corral_error err;
    lora_variant v[3];
    const float scales[3] = {0.25f, 0.5f, 0.75f};
    for (int i = 0; i < 3; i++) {
        src.scale = scales[i];
        ck_assert_int_eq(lora_variant_prepare(&req, &v[i], &err), CORRAL_OK);
        ck_assert_int_eq(v[i].cache_hit, 0);
        /* Distinct, increasing use times even on coarse clocks. */
        struct timespec when[2] = {{1700000000 + i * 10, 0}, {1700000000 + i * 10, 0}};
        ck_assert_int_eq(utimensat(AT_FDCWD, v[i].path, when, 0), 0);
        if (i == 1) {
            /* Using the first again makes it more recent than the second. */
            src.scale = scales[0];
            lora_variant hit;
            ck_assert_int_eq(lora_variant_prepare(&req, &hit, &err), CORRAL_OK);
            ck_assert_int_eq(hit.cache_hit, 1);
        }
    }
    /* The third build trimmed the least recently used: the second. */
    ck_assert(file_exists(v[0].path));
    ck_assert(!file_exists(v[1].path));
    ck_assert(file_exists(v[2].path));
    ck_assert_uint_eq(v[2].trim.n_removed, 1);
    free(base), free(ad);
}
END_TEST

START_TEST(test_synth_adapter_deterministic) {
    char *base = shared("models/synth-llama-q4_0.gguf");
    lora_synth_params p = {.base_path = base,
                           .rank = 16,
                           .alpha = 32,
                           .targets = LORA_SYNTH_ALL_LINEAR,
                           .seed = 7,
                           .a_std = 0.02f,
                           .b_std = 0.02f,
                           .type = TENSOR_TYPE_F16};
    corral_error err;
    const char *a = tmp_path("s1.gguf"), *b = tmp_path("s2.gguf");
    ck_assert_int_eq(lora_synth_write(&p, a, &err), CORRAL_OK);
    ck_assert_int_eq(lora_synth_write(&p, b, &err), CORRAL_OK);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    ck_assert_int_eq(system(cmd), 0);
    gguf_file *g = gguf_open(base, &err);
    lora_adapter *ad = lora_adapter_open(a, g, &err);
    ck_assert_msg(ad != NULL, "%s", err.message);
    ck_assert_uint_eq(lora_adapter_target_count(ad), 14);
    lora_target_info ti;
    ck_assert_int_eq(lora_adapter_target(ad, 0, &ti), CORRAL_OK);
    ck_assert_uint_eq(ti.rank, 16);
    ck_assert(ti.scaling == 2.0f);
    lora_adapter_destroy(&ad);
    gguf_destroy(&g);
    p.rank = 0;
    ck_assert_int_eq(lora_synth_write(&p, a, &err), CORRAL_INVALID_ARGUMENT);
    free(base);
}
END_TEST

/* ---- bad adapters: one test each ----------------------------------------------------------------
 */

/* Merging must fail with `status` and a message containing every string of want (NULL-ended);
 * no output is left; the base still loads and runs. */
static void expect_merge_error(const char *base_rel, const char *adapter, corral_status status,
                               const char *const *want) {
    char *base = shared(base_rel);
    lora_source s = {adapter, 1.0f};
    const char *out = tmp_path("bad-out.gguf");
    corral_error err;
    uint64_t merges = lora_merge_count();
    corral_status st = lora_merge_file(base, &s, 1, out, NULL, NULL, &err);
    ck_assert_msg(st == status, "status %s (%s), wanted %s", corral_status_name(st), err.message,
                  corral_status_name(status));
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(err.message, want[i]), "'%s' lacks '%s'", err.message, want[i]);
    printf("  rejected: %s\n", err.message);
    ck_assert(!file_exists(out));
    ck_assert(lora_merge_count() == merges);
    /* The variant path reports the same error and leaves no image in the cache. */
    lora_variant_request req = {
        .base_path = base, .adapters = &s, .n_adapters = 1, .cache_dir = tmp_path("badcache")};
    lora_variant v;
    ck_assert_int_eq(lora_variant_prepare(&req, &v, &err), status);
    ck_assert(!file_exists(v.path));
    assert_base_usable(base);
    free(base);
}

/* A one-target adapter on stories260K's blk.0.attn_q.weight (64 x 64), rank 8. */
static void stories_adapter(craft_adapter *c, const char *arch) {
    char *base_path = shared("models/stories260K.gguf");
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    *c = (craft_adapter){.arch = arch, .alpha = 16.0f};
    craft_add(c, base, "blk.0.attn_q.weight", 8, 1);
    craft_add(c, base, "blk.0.attn_v.weight", 8, 2);
    gguf_destroy(&base);
    free(base_path);
}

START_TEST(test_bad_wrong_architecture) {
    craft_adapter c;
    stories_adapter(&c, "qwen2");
    const char *p = tmp_path("arch.gguf");
    craft_write(&c, p, NULL, NULL);
    const char *want[] = {"arch.gguf", "wrong architecture", "'qwen2'", "'llama'", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_INVALID_ARGUMENT, want);
    craft_free(&c);
}
END_TEST

START_TEST(test_bad_shape_mismatch) {
    craft_adapter c;
    stories_adapter(&c, "llama");
    /* blk.0.attn_q's lora_b claims 32 output rows; the base has 64. */
    const int64_t ne_b[2] = {8, 32};
    const char *p = tmp_path("shape.gguf");
    craft_write(&c, p, NULL, ne_b);
    const char *want[] = {"blk.0.attn_q.weight", "shape mismatch", "64 rows x 64 columns", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_INVALID_ARGUMENT, want);
    craft_free(&c);
}
END_TEST

START_TEST(test_bad_missing_lora_b) {
    craft_adapter c;
    stories_adapter(&c, "llama");
    const char *p = tmp_path("nob.gguf");
    craft_write(&c, p, "blk.0.attn_v.weight", NULL);
    const char *want[] = {"missing blk.0.attn_v.weight.lora_b", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_FORMAT, want);
    craft_free(&c);
}
END_TEST

START_TEST(test_bad_rank_mismatch) {
    craft_adapter c;
    stories_adapter(&c, "llama");
    /* lora_a has rank 8, lora_b rank 4 (4 x 64 of the same data: big enough). */
    const int64_t ne_b[2] = {4, 64};
    const char *p = tmp_path("rank.gguf");
    craft_write(&c, p, NULL, ne_b);
    const char *want[] = {"blk.0.attn_q.weight", "rank mismatch between A and B", "rank 8",
                          "rank 4", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_FORMAT, want);
    craft_free(&c);
}
END_TEST

START_TEST(test_bad_tensor_not_in_base) {
    char *base_path = shared("models/stories260K.gguf");
    corral_error err;
    gguf_file *base = gguf_open(base_path, &err);
    craft_adapter c = {.arch = "llama", .alpha = 16.0f};
    craft_add(&c, base, "blk.0.attn_q.weight", 8, 1);
    snprintf(c.t[0].tensor, sizeof c.t[0].tensor, "blk.7.attn_q.weight"); /* 5 layers only */
    gguf_destroy(&base);
    const char *p = tmp_path("layer7.gguf");
    craft_write(&c, p, NULL, NULL);
    const char *want[] = {"blk.7.attn_q.weight", "does not exist in the base model", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_INVALID_ARGUMENT, want);
    craft_free(&c);
    free(base_path);
}
END_TEST

START_TEST(test_bad_non_finite_factor) {
    craft_adapter c;
    stories_adapter(&c, "llama");
    c.t[1].b[17] = NAN; /* blk.0.attn_v.weight.lora_b */
    const char *p = tmp_path("nan.gguf");
    craft_write(&c, p, NULL, NULL);
    const char *want[] = {"blk.0.attn_v.weight", "lora_b holds a non-finite value", NULL};
    expect_merge_error("models/stories260K.gguf", p, CORRAL_FORMAT, want);
    craft_free(&c);
}
END_TEST

/* A PEFT directory holding a copy of the shared adapter's config and the given raw safetensors. */
static const char *peft_with_raw(const char *name, const char *header, size_t data,
                                 uint64_t claimed) {
    const char *dir = tmp_path(name);
    write_peft(dir, PEFT_CONFIG_PLAIN, NULL, 0);
    write_raw_safetensors(dir, header, data, claimed);
    return dir;
}

START_TEST(test_bad_safetensors_offsets_past_end) {
    const char *dir =
        peft_with_raw("past",
                      "{\"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\":"
                      "{\"dtype\":\"F32\",\"shape\":[8,64],\"data_offsets\":[0,2048]}}",
                      1000, 0);
    const char *want[] = {"adapter_model.safetensors", "q_proj.lora_A.weight",
                          "run past the end of the 1000-byte data buffer", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_FORMAT, want);
}
END_TEST

START_TEST(test_bad_safetensors_overlap) {
    const char *dir =
        peft_with_raw("overlap",
                      "{\"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\":"
                      "{\"dtype\":\"F32\",\"shape\":[8,64],\"data_offsets\":[0,2048]},"
                      "\"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight\":"
                      "{\"dtype\":\"F32\",\"shape\":[64,8],\"data_offsets\":[1024,3072]}}",
                      3072, 0);
    const char *want[] = {"overlap", "bytes 0..2048", "bytes 1024..3072", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_FORMAT, want);
}
END_TEST

START_TEST(test_bad_safetensors_dtype) {
    const char *dir =
        peft_with_raw("dtype",
                      "{\"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\":"
                      "{\"dtype\":\"F31\",\"shape\":[8,64],\"data_offsets\":[0,2048]}}",
                      2048, 0);
    const char *want[] = {"bad dtype 'F31'", "q_proj.lora_A.weight", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_FORMAT, want);
}
END_TEST

START_TEST(test_bad_safetensors_header_length) {
    const char *dir = peft_with_raw("hlen", "{}", 16, (uint64_t)1 << 40);
    const char *want[] = {"header length 1099511627776 is absurd", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_FORMAT, want);
}
END_TEST

START_TEST(test_bad_unknown_peft_module) {
    float a[8 * 64] = {0}, b[64 * 8] = {0};
    st_entry e[2] = {
        {"base_model.model.model.layers.0.self_attn.rotary_emb.lora_A.weight",
         "F32",
         {8, 64},
         a,
         sizeof a},
        {"base_model.model.model.layers.0.self_attn.rotary_emb.lora_B.weight",
         "F32",
         {64, 8},
         b,
         sizeof b},
    };
    const char *dir = tmp_path("unknown");
    write_peft(dir, PEFT_CONFIG_PLAIN, e, 2);
    const char *want[] = {"unknown PEFT module 'model.layers.0.self_attn.rotary_emb'", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_UNSUPPORTED, want);
}
END_TEST

START_TEST(test_bad_unsupported_variants_by_name) {
    static const struct {
        const char *config, *want;
    } cases[] = {
        {"{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,\"use_dora\":true}", "DoRA (use_dora)"},
        {"{\"peft_type\":\"LOHA\",\"r\":8}", "peft_type 'LOHA'"},
        {"{\"r\":8,\"bias\":\"all\"}", "trained biases"},
        {"{\"r\":8,\"modules_to_save\":[\"lm_head\"]}", "modules_to_save"},
        {"{\"r\":8,\"init_lora_weights\":\"pissa_niter_4\"}", "init_lora_weights 'pissa_niter_4'"},
        {"{\"r\":8,\"rank_pattern\":{\"(q|k)_proj\":4}}", "groups, alternation"},
        {"{\"r\":0}", "r must be an integer"},
        {"{\"r\":8,\"lora_alpha\":\"16\"}", "lora_alpha is not a number"},
    };
    float a[8 * 64] = {0}, b[64 * 8] = {0};
    st_entry e[2] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
         "F32",
         {8, 64},
         a,
         sizeof a},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
         "F32",
         {64, 8},
         b,
         sizeof b},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "variant%zu", i);
        const char *dir = tmp_path(name);
        write_peft(dir, cases[i].config, e, 2);
        const char *want[] = {cases[i].want, "adapter_config.json", NULL};
        corral_status st = i < 6 ? CORRAL_UNSUPPORTED : CORRAL_FORMAT;
        expect_merge_error("models/stories260K.gguf", dir, st, want);
    }
    /* A DoRA magnitude tensor without the config flag is refused by name too. */
    float m[64] = {0};
    st_entry d[3] = {e[0],
                     e[1],
                     {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                      "F32",
                      {1, 64},
                      m,
                      sizeof m}};
    const char *dir = tmp_path("dora-tensor");
    write_peft(dir, PEFT_CONFIG_PLAIN, d, 3);
    const char *want[] = {"DoRA magnitude", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_UNSUPPORTED, want);
}
END_TEST

START_TEST(test_bad_peft_rank_and_base_config) {
    /* The config's rank disagrees with the tensors. */
    float a[4 * 64] = {0}, b[64 * 4] = {0};
    st_entry e[2] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
         "F32",
         {4, 64},
         a,
         sizeof a},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
         "F32",
         {64, 4},
         b,
         sizeof b},
    };
    const char *dir = tmp_path("rank4");
    write_peft(dir, PEFT_CONFIG_PLAIN, e, 2);
    const char *want[] = {"rank mismatch", "config gives rank 8", "rank 4", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_FORMAT, want);
    /* A base config beside the adapter says qwen2. */
    const char *hf = tmp_path("qwen-hf");
    ck_assert_int_eq(mkdir(hf, 0700), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", hf);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"qwen2\"}", f);
    fclose(f);
    const char *dir2 = tmp_path("qwen-adapter");
    write_peft(dir2, "{\"r\":4,\"lora_alpha\":8,\"base_model_name_or_path\":\"qwen-hf\"}", e, 2);
    const char *want2[] = {"wrong architecture", "'qwen2' model", "'llama'", NULL};
    expect_merge_error("models/stories260K.gguf", dir2, CORRAL_INVALID_ARGUMENT, want2);
}
END_TEST

/* A rank_pattern key is matched by recursion, one frame per atom that can match nothing: 100000
 * "x*" ahead of "q_proj" (a 200 KB config) overflowed the stack. Keys are bounded instead. */
START_TEST(test_bad_peft_pattern_too_long) {
    float a[8 * 64] = {0}, b[64 * 8] = {0};
    st_entry e[2] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", {8, 64}, a,
         sizeof a},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "F32", {64, 8}, b,
         sizeof b},
    };
    enum { STARS = 100000 };
    char *config = malloc(2 * STARS + 128);
    ck_assert_ptr_nonnull(config);
    size_t len = (size_t)sprintf(config, "{\"r\": 8, \"lora_alpha\": 16, \"rank_pattern\": {\"");
    for (int i = 0; i < STARS; i++, len += 2) memcpy(config + len, "x*", 2);
    strcpy(config + len, "q_proj\": 4}}");
    const char *dir = tmp_path("long-pattern");
    write_peft(dir, config, e, 2);
    free(config);
    const char *want[] = {"rank_pattern key", "longer than 1024 bytes", NULL};
    expect_merge_error("models/stories260K.gguf", dir, CORRAL_UNSUPPORTED, want);
}
END_TEST

/* ---- merge, then quantize ---------------------------------------------------------------------
 */

/* RMS distance of the teacher-forced logits of model `path` from a reference logits file. */
static double logits_rms(const char *path, const char *stem) {
    char rel[300];
    snprintf(rel, sizeof rel, "reference/%s.ids.txt", stem);
    int32_t ids[64];
    const int n = ref_read_ids(rel, ids, 64);
    ck_assert_int_eq(n, 32);
    float *got = run_logits(path, ids, n);
    snprintf(rel, sizeof rel, "reference/%s.logits.f32", stem);
    size_t cnt;
    float *ref = ref_read_f32(rel, &cnt);
    ck_assert_ptr_nonnull(ref);
    ck_assert_uint_eq(cnt, (size_t)n * N_VOCAB);
    double sum = 0;
    for (size_t i = 0; i < cnt; i++) sum += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    free(got);
    free(ref);
    return sqrt(sum / (double)cnt);
}

/* The acceptance of merge-then-quantize: the shared adapter merged into the F32 base in f32 and
 * quantized once to Q4_0 is closer to llama.cpp's F32 runtime-LoRA logits than the same adapter
 * merged into the Q4_0 base (quantized, dequantized, merged and quantized again). */
START_TEST(test_merge_then_quantize_beats_quantize_then_merge) {
    char *f32 = shared("models/stories260K.gguf"), *q4 = shared("models/stories260K-q4_0.gguf");
    char *ad = shared(SHARED_GGUF);
    lora_source s = {ad, 1.0f};
    corral_error err;
    lora_merge_report rep;
    ck_assert_msg(lora_merge_quantize_file(f32, &s, 1, "q4_0", tmp_path("mq.gguf"), NULL, &rep,
                                           &err) == CORRAL_OK,
                  "%s", err.message);
    ck_assert_uint_eq(rep.n_merged_tensors, 35);
    ck_assert_int_eq(lora_merge_file(q4, &s, 1, tmp_path("qm.gguf"), NULL, NULL, &err), CORRAL_OK);
    const double once = logits_rms(tmp_path("mq.gguf"), "stories260K__lora-r8-s100");
    const double twice = logits_rms(tmp_path("qm.gguf"), "stories260K__lora-r8-s100");
    printf("  logits RMS from the F32 reference: merge then quantize %.4f, quantize then merge "
           "%.4f\n",
           once, twice);
    ck_assert_msg(once < twice, "merge-then-quantize %.4g is not closer than %.4g", once, twice);
    /* Both files have the same types: the difference is the rounding alone. */
    gguf_file *a = gguf_open(tmp_path("mq.gguf"), &err), *b = gguf_open(tmp_path("qm.gguf"), &err);
    ck_assert(a && b);
    for (uint64_t i = 0; i < gguf_tensor_count(b); i++) {
        const gguf_tensor *tb = gguf_tensor_at(b, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)tb->name.len, tb->name.data);
        const gguf_tensor *ta = gguf_find_tensor(a, name);
        ck_assert_ptr_nonnull(ta);
        ck_assert_msg(ta->type == tb->type, "%s: %s and %s", name, tensor_type_name(ta->type),
                      tensor_type_name(tb->type));
    }
    gguf_str v;
    ck_assert_int_eq(gguf_get_str(a, LORA_KEY_QUANTIZE, &v, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(v, "Q4_0"));
    gguf_destroy(&a);
    gguf_destroy(&b);
    free(f32);
    free(q4);
    free(ad);
}
END_TEST

/* A quantized variant without adapters is `corral quantize`'s output (every tensor's bytes) in a
 * checksummed image in the cache, made once: the second request maps it. With an adapter, the
 * untouched tensors keep those bytes and the targeted ones move. */
START_TEST(test_quantized_variant_cache) {
    char *base = shared("models/synth-llama-f32.gguf");
    corral_error err;
    quantize_params qp = quantize_params_default();
    qp.ftype = QUANTIZE_FTYPE_Q4_K_M;
    ck_assert_int_eq(quantize_file(base, tmp_path("plain.gguf"), &qp, NULL, &err), CORRAL_OK);
    const char *cache = tmp_path("cache");
    lora_variant_request req = {
        .base_path = base, .quantize = "q4_k_m", .cache_dir = cache, .verify = IMAGE_VERIFY_FULL};
    lora_variant v1, v2;
    const uint64_t merges = lora_merge_count();
    ck_assert_msg(lora_variant_prepare(&req, &v1, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_int_eq(v1.cache_hit, 0);
    ck_assert_uint_eq(lora_merge_count(), merges + 1);
    ck_assert_msg(strstr(v1.path, "/" LORA_QUANT_CACHE_FILE_PREFIX) != NULL, "%s", v1.path);
    ck_assert_int_eq(lora_variant_prepare(&req, &v2, &err), CORRAL_OK);
    ck_assert_int_eq(v2.cache_hit, 1);
    ck_assert_str_eq(v1.path, v2.path);
    ck_assert_uint_eq(lora_merge_count(), merges + 1);
    image_problem problem;
    image *im = image_open(v1.path, LORA_QUANT_IMAGE_KIND, v1.fingerprint, IMAGE_VERIFY_FULL,
                           &problem, &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    gguf_file *plain = gguf_open(tmp_path("plain.gguf"), &err);
    const gguf_file *g = image_gguf(im);
    ck_assert_uint_eq(gguf_tensor_count(g), gguf_tensor_count(plain));
    for (uint64_t i = 0; i < gguf_tensor_count(plain); i++) {
        const gguf_tensor *a = gguf_tensor_at(plain, i), *b = gguf_tensor_at(g, i);
        ck_assert(a->type == b->type && a->size == b->size);
        ck_assert(memcmp(a->data, b->data, (size_t)a->size) == 0);
    }
    /* Another type is another variant; a merged-model request does not take this image. */
    req.quantize = "q8_0";
    lora_variant v3;
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_OK);
    ck_assert_str_ne(v3.fingerprint, v1.fingerprint);
    image_destroy(&im);
    gguf_destroy(&plain);
    /* Errors: an unknown type, a quantized base. */
    req.quantize = "q3_k_m";
    ck_assert_int_eq(lora_variant_prepare(&req, &v3, &err), CORRAL_INVALID_ARGUMENT);
    char *q8 = shared("models/synth-llama-q8_0.gguf");
    ck_assert_int_eq(
        lora_merge_quantize_file(q8, NULL, 0, "q4_0", tmp_path("x.gguf"), NULL, NULL, &err),
        CORRAL_FAILED_PRECONDITION);
    ck_assert_msg(strstr(err.message, "full-precision") != NULL, "%s", err.message);
    ck_assert(!file_exists(tmp_path("x.gguf")));
    free(q8);
    free(base);
}
END_TEST

static Suite *lora_suite(void) {
    Suite *s = suite_create("lora");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, tmp_setup, tmp_teardown);
    tcase_add_test(core, test_gguf_and_peft_forms_bit_identical);
    tcase_add_test(core, test_merge_matches_llama_cpp_export);
    tcase_add_test(core, test_merged_logits_match_runtime_references);
    tcase_add_test(core, test_merged_greedy_matches_reference);
    tcase_add_test(core, test_several_adapters_match_unmerged_f32);
    tcase_add_test(core, test_peft_patterns_rslora_permutation);
    tcase_add_test(core, test_peft_qwen2_unpermuted_half_precision);
    tcase_add_test(core, test_quantized_bases_within_own_quantization_error);
    tcase_add_test(core, test_cache_second_load_does_no_merge);
    tcase_add_test(core, test_synth_adapter_deterministic);
    tcase_add_test(core, test_merge_then_quantize_beats_quantize_then_merge);
    tcase_add_test(core, test_quantized_variant_cache);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, tmp_setup, tmp_teardown);
    tcase_add_test(limits, test_cache_trimmed_by_size_lru);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, tmp_setup, tmp_teardown);
    tcase_add_test(errors, test_bad_wrong_architecture);
    tcase_add_test(errors, test_bad_shape_mismatch);
    tcase_add_test(errors, test_bad_missing_lora_b);
    tcase_add_test(errors, test_bad_rank_mismatch);
    tcase_add_test(errors, test_bad_tensor_not_in_base);
    tcase_add_test(errors, test_bad_non_finite_factor);
    tcase_add_test(errors, test_bad_safetensors_offsets_past_end);
    tcase_add_test(errors, test_bad_safetensors_overlap);
    tcase_add_test(errors, test_bad_safetensors_dtype);
    tcase_add_test(errors, test_bad_safetensors_header_length);
    tcase_add_test(errors, test_bad_unknown_peft_module);
    tcase_add_test(errors, test_bad_unsupported_variants_by_name);
    tcase_add_test(errors, test_bad_peft_rank_and_base_config);
    tcase_add_test(errors, test_bad_peft_pattern_too_long);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(lora_suite)
