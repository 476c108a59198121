/*
 * test_synth.c — Check suite for synthetic models (engine/include/corral/synth.h) and the GGUF
 * builder's streaming tensors (gguf_builder_add_tensor_fill) they are written with.
 *
 * What is independent here: tensor types are compared with files llama.cpp's quantizer wrote
 * (../shared/models: synth-llama-*.gguf are `--pure`, stories260K-q4_0/q8_0 and
 * synth-llama-q4_k_m use its default rules), and with llama.cpp's use_more_bits rule written out
 * again below; copied vocabularies must tokenize llama.cpp's tokenizer test inputs into its
 * reference ids; written files are read back by the engine's own loader and run.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/model.h"
#include "corral/synth.h"
#include "corral/tensor.h"
#include "corral/tokenizer.h"
#include "refdata.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static char tmp_dir[64];

static void make_tmp_dir(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/corral-synth-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void remove_tmp_dir(void) {
    DIR *d = opendir(tmp_dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(tmp_dir);
}

/* Path of a file in the test's temporary folder (static buffer, one of four in rotation). */
static const char *tmp_path(const char *name) {
    static char paths[4][512];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

/* A small model whose dimensions are multiples of 256, so every type is really used. */
static synth_params small_params(const char *arch, synth_type type) {
    synth_params p = synth_params_default();
    snprintf(p.arch, sizeof p.arch, "%s", arch);
    p.n_embd = 256;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 512;
    p.n_vocab = 320;
    p.n_ctx = 64;
    p.type = type;
    p.seed = 7;
    p.n_threads = 2;
    return p;
}

static void write_ok(const synth_params *p, const char *path) {
    corral_error err = {0};
    synth_report rep;
    corral_status st = synth_write(p, path, &rep, &err);
    ck_assert_msg(st == CORRAL_OK, "synth_write %s: %s", path, err.message);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_uint_eq(rep.file_bytes, (uint64_t)sb.st_size);
}

static char *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_whole(a, &na), *y = read_whole(b, &nb);
    int eq = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

/* Load the model, prefill four tokens, then generate eight greedily: every logit finite and the
 * logits not all equal at every step. */
static void check_model_runs(const char *path) {
    corral_error err = {0};
    model *m = model_load(path, NULL, &err);
    ck_assert_msg(m != NULL, "model_load %s: %s", path, err.message);
    const uint32_t n_vocab = model_get_hparams(m)->n_vocab;
    kv_cache *kv = kv_cache_new(m, 32, KV_TYPE_F16, &err);
    ck_assert_msg(kv != NULL, "%s", err.message);
    model_runner *r = model_runner_new(m, 8, NULL, &err);
    ck_assert_msg(r != NULL, "%s", err.message);
    float *logits = malloc(n_vocab * sizeof *logits);
    int32_t prompt[4] = {1, 100, 200, 300 % (int32_t)n_vocab};
    ck_assert_int_eq(model_forward(r, kv, prompt, 4, MODEL_LOGITS_LAST, logits, &err), CORRAL_OK);
    for (int step = 0; step < 8; step++) {
        float lo = INFINITY, hi = -INFINITY;
        int32_t best = 0;
        for (uint32_t i = 0; i < n_vocab; i++) {
            ck_assert_msg(isfinite(logits[i]), "%s: logit %u is %g at step %d", path, i,
                          (double)logits[i], step);
            if (logits[i] < lo) lo = logits[i];
            if (logits[i] > hi) hi = logits[i], best = (int32_t)i;
        }
        ck_assert_msg(hi - lo > 0.01f, "%s: logits nearly equal (spread %g) at step %d", path,
                      (double)(hi - lo), step);
        ck_assert_int_eq(model_forward(r, kv, &best, 1, MODEL_LOGITS_LAST, logits, &err),
                         CORRAL_OK);
    }
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
}

/* Compare the type of every tensor of a written file with a reference file's (same names). */
static void check_types_match(const char *ours, const char *reference) {
    corral_error err = {0};
    gguf_file *a = gguf_open(ours, &err), *b = gguf_open(reference, &err);
    ck_assert_msg(a && b, "%s", err.message);
    ck_assert_uint_eq(gguf_tensor_count(a), gguf_tensor_count(b));
    for (uint64_t i = 0; i < gguf_tensor_count(b); i++) {
        const gguf_tensor *rt = gguf_tensor_at(b, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)rt->name.len, rt->name.data);
        const gguf_tensor *t = gguf_find_tensor(a, name);
        ck_assert_msg(t != NULL, "%s: tensor %s missing", ours, name);
        ck_assert_msg(t->type == rt->type, "%s: %s is %s, %s has %s", ours, name,
                      tensor_type_name(t->type), reference, tensor_type_name(rt->type));
        ck_assert_int_eq(t->ne[0], rt->ne[0]);
        ck_assert_int_eq(t->ne[1], rt->ne[1]);
    }
    uint32_t fa = 0, fb = 1;
    ck_assert_int_eq(gguf_get_u32(a, "general.file_type", &fa, &err), CORRAL_OK);
    ck_assert_int_eq(gguf_get_u32(b, "general.file_type", &fb, &err), CORRAL_OK);
    ck_assert_uint_eq(fa, fb);
    gguf_destroy(&a);
    gguf_destroy(&b);
}

static uint32_t file_tensor_type(const char *path, const char *tensor) {
    corral_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    const gguf_tensor *t = gguf_find_tensor(f, tensor);
    ck_assert_msg(t != NULL, "%s: no tensor %s", path, tensor);
    uint32_t type = t->type;
    gguf_destroy(&f);
    return type;
}

/* ---- core ------------------------------------------------------------------------------------ */

/* Every type in llama and qwen2, and three in the other architectures, loads, generates, and
 * stores what synth_tensor_type says. */
START_TEST(test_every_type_loads_and_runs) {
    make_tmp_dir();
    const char *archs[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};
    for (int a = 0; a < 5; a++) {
        for (int t = 0; t < SYNTH_TYPE_COUNT; t++) {
            if (a >= 2 && t != SYNTH_TYPE_F32 && t != SYNTH_TYPE_Q8_0 && t != SYNTH_TYPE_Q4_K_M)
                continue;
            synth_params p = small_params(archs[a], (synth_type)t);
            char name[64];
            snprintf(name, sizeof name, "%s-%s.gguf", archs[a], synth_type_name((synth_type)t));
            const char *path = tmp_path(name);
            write_ok(&p, path);
            check_model_runs(path);
            corral_error err = {0};
            gguf_file *f = gguf_open(path, &err);
            ck_assert_ptr_nonnull(f);
            int has_bias = 0;
            for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
                const gguf_tensor *gt = gguf_tensor_at(f, i);
                char tn[128];
                snprintf(tn, sizeof tn, "%.*s", (int)gt->name.len, gt->name.data);
                ck_assert_int_eq((int32_t)gt->type, synth_tensor_type(&p, tn));
                if (strstr(tn, ".bias")) has_bias = 1;
                if (gt->n_dims == 1) ck_assert_uint_eq(gt->type, TENSOR_TYPE_F32);
            }
            ck_assert_int_eq(has_bias, a == 1);
            gguf_destroy(&f);
            unlink(path);
        }
    }
    remove_tmp_dir();
}
END_TEST

START_TEST(test_deterministic_bytes) {
    make_tmp_dir();
    synth_params p = small_params("qwen2", SYNTH_TYPE_Q4_K_M);
    write_ok(&p, tmp_path("a.gguf"));
    write_ok(&p, tmp_path("b.gguf"));
    ck_assert(files_equal(tmp_path("a.gguf"), tmp_path("b.gguf")));
    /* The split of rows between threads does not show in the bytes. */
    p.n_threads = 1;
    write_ok(&p, tmp_path("c.gguf"));
    ck_assert(files_equal(tmp_path("a.gguf"), tmp_path("c.gguf")));
    p.n_threads = 3;
    p.seed = 8;
    write_ok(&p, tmp_path("d.gguf"));
    ck_assert(!files_equal(tmp_path("a.gguf"), tmp_path("d.gguf")));
    /* Same layout and size: only the weights differ. */
    size_t na, nd;
    char *x = read_whole(tmp_path("a.gguf"), &na), *y = read_whole(tmp_path("d.gguf"), &nd);
    ck_assert_uint_eq(na, nd);
    free(x);
    free(y);
    remove_tmp_dir();
}
END_TEST

START_TEST(test_tied_and_separate_output) {
    make_tmp_dir();
    for (int tied = 0; tied < 2; tied++) {
        synth_params p = small_params("llama", SYNTH_TYPE_Q8_0);
        p.tied = tied;
        const char *path = tmp_path(tied ? "tied.gguf" : "separate.gguf");
        write_ok(&p, path);
        corral_error err = {0};
        model *m = model_load(path, NULL, &err);
        ck_assert_msg(m != NULL, "%s", err.message);
        ck_assert_int_eq(model_get_hparams(m)->tied_output, tied);
        ck_assert_int_eq(gguf_find_tensor(model_get_gguf(m), "output.weight") == NULL, tied);
        model_destroy(&m);
        check_model_runs(path);
    }
    remove_tmp_dir();
}
END_TEST

/* Every hyperparameter key model_load reads is written, with the value given. */
START_TEST(test_hparams_round_trip) {
    make_tmp_dir();
    synth_params p = small_params("qwen2", SYNTH_TYPE_F16);
    p.n_ctx = 1000;
    p.rope_base = 123456.0f;
    p.rms_eps = 3e-6f;
    snprintf(p.name, sizeof p.name, "my synthetic model");
    write_ok(&p, tmp_path("h.gguf"));
    corral_error err = {0};
    model *m = model_load(tmp_path("h.gguf"), NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    const model_hparams *hp = model_get_hparams(m);
    ck_assert_str_eq(hp->arch, "qwen2");
    ck_assert_str_eq(hp->name, "my synthetic model");
    ck_assert_uint_eq(hp->n_embd, 256);
    ck_assert_uint_eq(hp->n_layer, 2);
    ck_assert_uint_eq(hp->n_head, 4);
    ck_assert_uint_eq(hp->n_head_kv, 2);
    ck_assert_uint_eq(hp->head_dim, 64);
    ck_assert_uint_eq(hp->n_rot, 64);
    ck_assert_uint_eq(hp->n_ff, 512);
    ck_assert_uint_eq(hp->n_vocab, 320);
    ck_assert_uint_eq(hp->n_ctx_train, 1000);
    ck_assert_float_eq(hp->rope_freq_base, 123456.0f);
    ck_assert_float_eq(hp->rms_eps, 3e-6f);
    uint32_t ft = 0;
    ck_assert_int_eq(gguf_get_u32(model_get_gguf(m), "general.file_type", &ft, &err), CORRAL_OK);
    ck_assert_uint_eq(ft, 1); /* llama.cpp's MOSTLY_F16 */
    /* The generated vocabulary round-trips text through the byte tokens and pieces. */
    const tokenizer *tok = model_get_tokenizer(m);
    ck_assert_int_eq(tok_vocab_size(tok), 320);
    ck_assert_int_eq(tok_bos(tok), 1);
    ck_assert_int_eq(tok_eos(tok), 2);
    int32_t ids[64];
    size_t n = 0;
    const char *text = "hello world, 42!";
    ck_assert_int_eq(tok_encode(tok, text, strlen(text), 0, ids, 64, &n, &err), CORRAL_OK);
    ck_assert_uint_gt(n, 0);
    char out[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *piece = tok_token_text(tok, ids[i], &len);
        ck_assert_ptr_nonnull(piece);
        /* Byte tokens read <0xNN>; pieces use U+2581 for spaces. */
        if (len == 6 && strncmp(piece, "<0x", 3) == 0) {
            out[used++] = (char)strtol(piece + 3, NULL, 16);
        } else {
            for (size_t k = 0; k < len; k++) {
                if (k + 2 < len && memcmp(piece + k, "\xe2\x96\x81", 3) == 0) {
                    out[used++] = ' ';
                    k += 2;
                } else {
                    out[used++] = piece[k];
                }
            }
        }
    }
    out[used] = '\0';
    ck_assert_str_eq(out, " hello world, 42!"); /* SPM adds the space prefix */
    model_destroy(&m);
    remove_tmp_dir();
}
END_TEST

/* ---- llama.cpp's type choices ---------------------------------------------------------------- */

/* --pure against the pure files llama.cpp's quantizer wrote for the same shape. */
START_TEST(test_pure_types_match_llama_cpp) {
    make_tmp_dir();
    static const struct {
        synth_type type;
        const char *file;
    } cases[] = {
        {SYNTH_TYPE_F32, "synth-llama-f32.gguf"},   {SYNTH_TYPE_F16, "synth-llama-f16.gguf"},
        {SYNTH_TYPE_BF16, "synth-llama-bf16.gguf"}, {SYNTH_TYPE_Q8_0, "synth-llama-q8_0.gguf"},
        {SYNTH_TYPE_Q4_0, "synth-llama-q4_0.gguf"}, {SYNTH_TYPE_Q4_1, "synth-llama-q4_1.gguf"},
        {SYNTH_TYPE_Q5_0, "synth-llama-q5_0.gguf"}, {SYNTH_TYPE_Q5_1, "synth-llama-q5_1.gguf"},
        {SYNTH_TYPE_Q4_K, "synth-llama-q4_k.gguf"}, {SYNTH_TYPE_Q5_K, "synth-llama-q5_k.gguf"},
        {SYNTH_TYPE_Q6_K, "synth-llama-q6_k.gguf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth_params p = synth_params_default(); /* the shared synth files' shape */
        p.type = cases[i].type;
        p.pure = 1;
        char ref[256];
        snprintf(ref, sizeof ref, "models/%s", cases[i].file);
        write_ok(&p, tmp_path("pure.gguf"));
        check_types_match(tmp_path("pure.gguf"), test_shared_path(ref));
    }
    remove_tmp_dir();
}
END_TEST

/* llama-quantize's default rules: Q4_K_M on the synth shape; Q4_0 and Q8_0 on stories260K's,
 * whose ffn_down rows (172) fit no 32-block and whose output falls back from Q6_K to Q8_0. */
START_TEST(test_mixes_match_llama_cpp) {
    make_tmp_dir();
    synth_params p = synth_params_default();
    p.type = SYNTH_TYPE_Q4_K_M;
    write_ok(&p, tmp_path("km.gguf"));
    check_types_match(tmp_path("km.gguf"), test_shared_path("models/synth-llama-q4_k_m.gguf"));

    synth_params s = synth_params_default();
    s.n_embd = 64;
    s.n_layer = 5;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_ff = 172;
    s.n_vocab = 512;
    s.n_ctx = 2048;
    s.type = SYNTH_TYPE_Q4_0;
    write_ok(&s, tmp_path("s40.gguf"));
    check_types_match(tmp_path("s40.gguf"), test_shared_path("models/stories260K-q4_0.gguf"));
    check_model_runs(tmp_path("s40.gguf"));
    s.type = SYNTH_TYPE_Q8_0;
    write_ok(&s, tmp_path("s80.gguf"));
    check_types_match(tmp_path("s80.gguf"), test_shared_path("models/stories260K-q8_0.gguf"));
    remove_tmp_dir();
}
END_TEST

/* The parameters of the shared files of the other architectures (../shared/README.md, "More
 * architectures"): the synth-llama shape with each family's keys. */
static synth_params shared_arch_params(const char *family, synth_type type) {
    ck_assert_uint_lt(strlen(family), sizeof(((synth_params *)0)->arch));
    synth_params p = synth_params_default();
    p.type = type;
    p.rms_eps = 1e-6f;
    if (strcmp(family, "llama3rope") == 0) {
        p.rms_eps = 1e-5f;
        p.n_ctx = 8192;
        p.rope_base = 500000.0f;
        p.rope_llama3_factor = 8.0f;
        p.rope_orig_ctx = 1024;
        return p;
    }
    snprintf(p.arch, sizeof p.arch, "%.15s", family);
    if (strcmp(family, "qwen3") == 0) {
        p.rope_base = 1e6f;
    } else if (strcmp(family, "gemma3") == 0) {
        p.rope_base = 1e6f;
        p.tied = 1;
        p.n_swa = 10;
        p.swa_pattern = 2;
    } else if (strcmp(family, "phi3") == 0) {
        p.rms_eps = 1e-5f;
    }
    return p;
}

/* The tensors, shapes and types llama.cpp's converter and quantizer gave the shared qwen3,
 * gemma3, phi3 (fused attn_qkv counted as attn_v by Q4_K_M) and Llama 3 RoPE files; the same
 * number of tensors; the same head-size and window keys; and rope_freqs.weight with Llama 3's
 * factors as the converter computed them. */
START_TEST(test_new_archs_match_llama_cpp) {
    make_tmp_dir();
    static const char *const files[] = {
        "qwen3-f32",      "qwen3-q8_0",      "qwen3-q4_k_m",      "gemma3-f32",
        "gemma3-q8_0",    "phi3-f32",        "phi3-q8_0",         "phi3-q4_k_m",
        "llama3rope-f32", "llama3rope-q8_0", "llama3rope-q4_k_m",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char family[32], ref[128];
        snprintf(family, sizeof family, "%s", files[i]);
        *strchr(family, '-') = '\0';
        const char *type_name = strchr(files[i], '-') + 1;
        synth_type type;
        corral_error err = {0};
        ck_assert_int_eq(synth_type_parse(type_name, &type, &err), CORRAL_OK);
        synth_params p = shared_arch_params(family, type);
        write_ok(&p, tmp_path("arch.gguf"));
        snprintf(ref, sizeof ref, "models/synth-%s.gguf", files[i]);
        check_types_match(tmp_path("arch.gguf"), test_shared_path(ref));
        gguf_file *a = gguf_open(tmp_path("arch.gguf"), &err),
                  *b = gguf_open(test_shared_path(ref), &err);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(b);
        ck_assert_uint_eq(gguf_tensor_count(a), gguf_tensor_count(b));
        static const char *const keys[] = {"attention.key_length", "attention.sliding_window",
                                           "attention.sliding_window_pattern"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            char key[96];
            snprintf(key, sizeof key, "%s.%s", p.arch, keys[k]);
            uint32_t va = 0, vb = 0;
            const corral_status sa = gguf_get_u32(a, key, &va, NULL),
                                sb = gguf_get_u32(b, key, &vb, NULL);
            /* (phi3's window key is written by converters and ignored by llama.cpp and corral.) */
            if (sb == CORRAL_OK && !(k > 0 && strcmp(p.arch, "phi3") == 0))
                ck_assert_msg(sa == CORRAL_OK && va == vb, "%s: %s", files[i], key);
        }
        const gguf_tensor *fa = gguf_find_tensor(a, "rope_freqs.weight"),
                          *fb = gguf_find_tensor(b, "rope_freqs.weight");
        ck_assert_int_eq(fa != NULL, fb != NULL);
        for (int64_t k = 0; fb && k < fb->ne[0]; k++) {
            const float x = ((const float *)fa->data)[k], y = ((const float *)fb->data)[k];
            ck_assert_msg(fabsf(x - y) <= 1e-6f * y, "rope_freqs[%lld]: %g, llama.cpp's %g",
                          (long long)k, (double)x, (double)y);
        }
        gguf_destroy(&a);
        gguf_destroy(&b);
        check_model_runs(tmp_path("arch.gguf"));
    }
    remove_tmp_dir();
}
END_TEST

/* llama.cpp's use_more_bits (llama-quant.cpp), written out again for the check. */
static int more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* Q4_K_M and Q5_K_M over TinyLlama's 22 layers (in a narrow file), and Q4_K (llama.cpp's Q4_K_S
 * rules) — checked in the written file, layer by layer. */
START_TEST(test_km_layers_over_22_blocks) {
    make_tmp_dir();
    const synth_type types[] = {SYNTH_TYPE_Q4_K_M, SYNTH_TYPE_Q5_K_M, SYNTH_TYPE_Q4_K};
    for (int k = 0; k < 3; k++) {
        synth_params p = small_params("llama", types[k]);
        p.n_layer = 22;
        p.n_ff = 256;
        p.n_threads = 1;
        const char *path = tmp_path("l22.gguf");
        write_ok(&p, path);
        const uint32_t base = types[k] == SYNTH_TYPE_Q5_K_M ? TENSOR_TYPE_Q5_K : TENSOR_TYPE_Q4_K;
        int n_more = 0;
        for (int il = 0; il < 22; il++) {
            char v[64], down[64], q[64];
            snprintf(v, sizeof v, "blk.%d.attn_v.weight", il);
            snprintf(down, sizeof down, "blk.%d.ffn_down.weight", il);
            snprintf(q, sizeof q, "blk.%d.attn_q.weight", il);
            uint32_t want_v, want_down;
            if (types[k] == SYNTH_TYPE_Q4_K) { /* Q4_K_S */
                want_v = il < 4 ? TENSOR_TYPE_Q5_K : base;
                want_down = il < 22 / 8 ? TENSOR_TYPE_Q5_K : base;
            } else {
                want_v = want_down = more_bits(il, 22) ? TENSOR_TYPE_Q6_K : base;
                n_more += more_bits(il, 22);
            }
            ck_assert_uint_eq(file_tensor_type(path, v), want_v);
            ck_assert_uint_eq(file_tensor_type(path, down), want_down);
            ck_assert_uint_eq(file_tensor_type(path, q), base);
        }
        if (types[k] != SYNTH_TYPE_Q4_K) ck_assert_int_eq(n_more, 10); /* 0,1,4,7,..,19,20,21 */
        ck_assert_uint_eq(file_tensor_type(path, "output.weight"), TENSOR_TYPE_Q6_K);
        ck_assert_uint_eq(file_tensor_type(path, "token_embd.weight"), base);
        unlink(path);
    }
    remove_tmp_dir();
}
END_TEST

/* The presets' real widths: 576 and 896 are not multiples of 256, so K-quants fall back there and
 * the tied embedding (typed as the output) becomes Q8_0, as in llama.cpp's files of these models.
 */
START_TEST(test_preset_fallbacks) {
    corral_error err = {0};
    synth_params p = synth_params_default();
    p.type = SYNTH_TYPE_Q4_K_M;
    ck_assert_int_eq(synth_params_set_preset(&p, "smollm2-135m", &err), CORRAL_OK);
    ck_assert_int_eq(synth_tensor_type(&p, "token_embd.weight"), TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(synth_tensor_type(&p, "output.weight"), -1); /* tied */
    ck_assert_int_eq(synth_tensor_type(&p, "blk.5.attn_q.weight"), TENSOR_TYPE_Q5_0);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.0.attn_v.weight"), TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.0.ffn_down.weight"), TENSOR_TYPE_Q6_K);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.4.ffn_down.weight"), TENSOR_TYPE_Q4_K);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.5.attn_norm.weight"), TENSOR_TYPE_F32);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.30.attn_q.weight"), -1);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.0.attn_q.bias"), -1); /* llama: none */

    ck_assert_int_eq(synth_params_set_preset(&p, "qwen2-0.5b", &err), CORRAL_OK);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.0.attn_q.bias"), TENSOR_TYPE_F32);
    ck_assert_int_eq(synth_tensor_type(&p, "token_embd.weight"), TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.3.ffn_gate.weight"), TENSOR_TYPE_Q5_0);
    p.type = SYNTH_TYPE_Q4_0;
    ck_assert_int_eq(synth_tensor_type(&p, "token_embd.weight"), TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(synth_tensor_type(&p, "blk.3.ffn_gate.weight"), TENSOR_TYPE_Q4_0);
    p.pure = 1;
    ck_assert_int_eq(synth_tensor_type(&p, "token_embd.weight"), TENSOR_TYPE_Q4_0);

    ck_assert_int_eq(synth_params_set_preset(&p, "tinyllama-1.1b", &err), CORRAL_OK);
    p.pure = 0;
    ck_assert_int_eq(synth_tensor_type(&p, "output.weight"), TENSOR_TYPE_Q6_K);
    ck_assert_int_eq(synth_tensor_type(&p, "token_embd.weight"), TENSOR_TYPE_Q4_0);
    p.type = SYNTH_TYPE_Q8_0;
    ck_assert_int_eq(synth_tensor_type(&p, "output.weight"), TENSOR_TYPE_Q8_0);
    p.type = SYNTH_TYPE_F16;
    ck_assert_int_eq(synth_tensor_type(&p, "output.weight"), TENSOR_TYPE_F16);
}
END_TEST

/* The presets' shapes, as the header documents them. */
START_TEST(test_presets) {
    corral_error err = {0};
    synth_params p = synth_params_default();
    ck_assert_int_eq(synth_params_set_preset(&p, "TinyLlama-1.1B", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "llama");
    ck_assert_uint_eq(p.n_embd, 2048);
    ck_assert_uint_eq(p.n_layer, 22);
    ck_assert_uint_eq(p.n_head, 32);
    ck_assert_uint_eq(p.n_head_kv, 4);
    ck_assert_uint_eq(p.n_ff, 5632);
    ck_assert_uint_eq(p.n_vocab, 32000);
    ck_assert_uint_eq(p.n_ctx, 2048);
    ck_assert_int_eq(p.tied, 0);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    ck_assert_int_eq(synth_params_set_preset(&p, "smollm2-135m", &err), CORRAL_OK);
    ck_assert_uint_eq(p.n_embd, 576);
    ck_assert_uint_eq(p.n_layer, 30);
    ck_assert_uint_eq(p.n_head, 9);
    ck_assert_uint_eq(p.n_head_kv, 3);
    ck_assert_uint_eq(p.n_vocab, 49152);
    ck_assert_float_eq(p.rope_base, 100000.0f);
    ck_assert_int_eq(p.tied, 1);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    ck_assert_int_eq(synth_params_set_preset(&p, "qwen2-0.5b", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "qwen2");
    ck_assert_uint_eq(p.n_embd, 896);
    ck_assert_uint_eq(p.n_head, 14);
    ck_assert_uint_eq(p.n_head_kv, 2);
    ck_assert_uint_eq(p.n_ff, 4864);
    ck_assert_uint_eq(p.n_vocab, 151936);
    ck_assert_uint_eq(p.n_ctx, 32768);
    ck_assert_float_eq(p.rope_base, 1000000.0f);
    ck_assert_int_eq(p.tied, 1);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    /* Heads wider than n_embd / n_head. */
    ck_assert_int_eq(synth_params_set_preset(&p, "qwen3-0.6b", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "qwen3");
    ck_assert_uint_eq(p.n_embd, 1024);
    ck_assert_uint_eq(p.n_layer, 28);
    ck_assert_uint_eq(p.n_head, 16);
    ck_assert_uint_eq(p.n_head_kv, 8);
    ck_assert_uint_eq(p.head_dim, 128);
    ck_assert_uint_eq(p.n_ff, 3072);
    ck_assert_uint_eq(p.n_ctx, 40960);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    ck_assert_int_eq(synth_params_set_preset(&p, "gemma3-1b", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "gemma3");
    ck_assert_uint_eq(p.n_embd, 1152);
    ck_assert_uint_eq(p.n_head, 4);
    ck_assert_uint_eq(p.n_head_kv, 1);
    ck_assert_uint_eq(p.head_dim, 256);
    ck_assert_uint_eq(p.n_vocab, 262144);
    ck_assert_uint_eq(p.n_swa, 512);
    ck_assert_uint_eq(p.swa_pattern, 6);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    ck_assert_int_eq(synth_params_set_preset(&p, "llama3.2-1b", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "llama");
    ck_assert_uint_eq(p.n_layer, 16);
    ck_assert_uint_eq(p.n_ctx, 131072);
    ck_assert_uint_eq(p.head_dim, 0); /* n_embd / n_head = 64 */
    ck_assert_uint_eq(p.n_swa, 0);
    ck_assert_float_eq(p.rope_llama3_factor, 32.0f);
    ck_assert_uint_eq(p.rope_orig_ctx, 8192);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
    ck_assert_int_eq(synth_params_set_preset(&p, "phi3-mini", &err), CORRAL_OK);
    ck_assert_str_eq(p.arch, "phi3");
    ck_assert_uint_eq(p.n_embd, 3072);
    ck_assert_uint_eq(p.n_head_kv, 32);
    ck_assert_uint_eq(p.n_vocab, 32064);
    ck_assert_float_eq(p.rope_llama3_factor, 0.0f);
    ck_assert_int_eq(p.tied, 0);
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_OK);
}
END_TEST

/* ---- vocabularies ---------------------------------------------------------------------------- */

/* Tokenize the first `max_cases` inputs of llama.cpp's test file with tok and compare with its
 * reference ids. */
static void check_tokenizes_like_llama_cpp(const tokenizer *tok, const char *vocab, int max_cases) {
    char rel[256];
    size_t len_in, len_out;
    snprintf(rel, sizeof rel, "vocab/%s.inp", vocab);
    char *inp = ref_read_file(rel, &len_in);
    snprintf(rel, sizeof rel, "vocab/%s.out", vocab);
    char *out = ref_read_file(rel, &len_out);
    ck_assert_msg(inp && out, "cannot read %s", rel);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *text = inp, *line = out;
    int cases = 0;
    for (char *end; cases < max_cases && (end = strstr(text, sep)); cases++) {
        char *eol = strchr(line, '\n');
        ck_assert_ptr_nonnull(eol);
        *eol = '\0';
        static int32_t want[4096], got[4096];
        int n_want = 0;
        for (char *p = line, *q; n_want < 4096; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p) break;
            want[n_want++] = (int32_t)v;
        }
        size_t n_got = 0;
        corral_error err = {0};
        ck_assert_int_eq(tok_encode(tok, text, (size_t)(end - text), 0, got, 4096, &n_got, &err),
                         CORRAL_OK);
        ck_assert_msg(n_got == (size_t)n_want && memcmp(got, want, n_got * sizeof *got) == 0,
                      "%s case %d: %zu ids, llama.cpp has %d", vocab, cases, n_got, n_want);
        text = end + strlen(sep);
        line = eol + 1;
    }
    ck_assert_int_gt(cases, 5);
    free(inp);
    free(out);
}

/* A copied vocabulary padded up to n_vocab keeps the source's tokenization; the pads are unused
 * "[PAD<i>]" tokens. SPM (scores) and byte-level BPE (merges, pre-tokenizer). */
START_TEST(test_vocab_from_padded) {
    make_tmp_dir();
    static const struct {
        const char *vocab;
        uint32_t n_tok, n_vocab;
    } cases[] = {
        {"ggml-vocab-llama-spm.gguf", 32000, 32010},
        {"ggml-vocab-gpt-2.gguf", 50257, 50304},
    };
    for (size_t c = 0; c < 2; c++) {
        synth_params p = small_params("llama", SYNTH_TYPE_Q8_0);
        p.n_embd = 64;
        p.n_head = 2;
        p.n_head_kv = 1;
        p.n_ff = 64;
        p.n_layer = 1;
        p.n_vocab = cases[c].n_vocab;
        char rel[128];
        snprintf(rel, sizeof rel, "vocab/%s", cases[c].vocab);
        char vocab_path[4096];
        snprintf(vocab_path, sizeof vocab_path, "%s", test_shared_path(rel));
        p.vocab_from = vocab_path;
        const char *path = tmp_path("v.gguf");
        write_ok(&p, path);
        corral_error err = {0};
        model *m = model_load(path, NULL, &err);
        ck_assert_msg(m != NULL, "%s", err.message);
        const tokenizer *tok = model_get_tokenizer(m);
        ck_assert_int_eq(tok_vocab_size(tok), (int32_t)cases[c].n_vocab);
        ck_assert_uint_eq(model_get_hparams(m)->n_vocab, cases[c].n_vocab);
        for (uint32_t i = cases[c].n_tok; i < cases[c].n_vocab; i++) {
            char want[32];
            size_t len;
            snprintf(want, sizeof want, "[PAD%u]", i);
            const char *text = tok_token_text(tok, (int32_t)i, &len);
            ck_assert(len == strlen(want) && memcmp(text, want, len) == 0);
            ck_assert_int_eq(tok_token_type(tok, (int32_t)i), TOK_TYPE_UNUSED);
        }
        /* The last real token is untouched. */
        gguf_file *src = gguf_open(vocab_path, &err);
        ck_assert_ptr_nonnull(src);
        gguf_str last = gguf_array_str(src, (uint64_t)gguf_find_key(src, "tokenizer.ggml.tokens"),
                                       cases[c].n_tok - 1);
        size_t len;
        const char *text = tok_token_text(tok, (int32_t)cases[c].n_tok - 1, &len);
        ck_assert(len == last.len && memcmp(text, last.data, len) == 0);
        gguf_destroy(&src);
        check_tokenizes_like_llama_cpp(tok, cases[c].vocab, 40);
        model_destroy(&m);
        check_model_runs(path);
    }
    remove_tmp_dir();
}
END_TEST

/* Exactly as many tokens as rows: the arrays are copied as they are. */
START_TEST(test_vocab_from_exact) {
    make_tmp_dir();
    synth_params p = small_params("llama", SYNTH_TYPE_F32);
    p.n_vocab = 512;
    char vocab_path[4096];
    snprintf(vocab_path, sizeof vocab_path, "%s", test_shared_path("models/stories260K.gguf"));
    p.vocab_from = vocab_path;
    write_ok(&p, tmp_path("e.gguf"));
    corral_error err = {0};
    gguf_file *a = gguf_open(tmp_path("e.gguf"), &err), *b = gguf_open(vocab_path, &err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    int n_tok_keys = 0;
    for (uint64_t i = 0; i < gguf_kv_count(b); i++) {
        gguf_str k = gguf_kv_key(b, i);
        if (k.len < 10 || memcmp(k.data, "tokenizer.", 10) != 0) continue;
        n_tok_keys++;
        char key[128], va[256], vb[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.data);
        int64_t j = gguf_find_key(a, key);
        ck_assert_msg(j >= 0, "key %s not copied", key);
        gguf_format_value(a, (uint64_t)j, va, sizeof va);
        gguf_format_value(b, i, vb, sizeof vb);
        ck_assert_str_eq(va, vb);
    }
    ck_assert_int_ge(n_tok_keys, 5);
    gguf_destroy(&a);
    gguf_destroy(&b);
    check_model_runs(tmp_path("e.gguf"));
    remove_tmp_dir();
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

START_TEST(test_smallest_generated_vocab) {
    make_tmp_dir();
    synth_params p = small_params("llama", SYNTH_TYPE_Q4_0);
    p.n_vocab = 259;
    write_ok(&p, tmp_path("v259.gguf"));
    check_model_runs(tmp_path("v259.gguf"));
    p.n_vocab = 258;
    corral_error err = {0};
    ck_assert_int_eq(synth_write(&p, tmp_path("v258.gguf"), NULL, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "n_vocab = 258"));
    ck_assert_int_eq(access(tmp_path("v258.gguf"), F_OK), -1);
    remove_tmp_dir();
}
END_TEST

/* Rows that fit no block: K-quants fall back to 32-blocks, then everything to F16. */
START_TEST(test_shape_fallbacks_written) {
    make_tmp_dir();
    synth_params p = small_params("llama", SYNTH_TYPE_Q4_K);
    p.pure = 1;
    p.n_embd = 96; /* 3 x 32: no 256-block */
    p.n_head = 3;
    p.n_head_kv = 1;
    p.n_ff = 80; /* no 32-block either */
    write_ok(&p, tmp_path("fb.gguf"));
    ck_assert_uint_eq(file_tensor_type(tmp_path("fb.gguf"), "blk.0.attn_q.weight"),
                      TENSOR_TYPE_Q5_0);
    ck_assert_uint_eq(file_tensor_type(tmp_path("fb.gguf"), "blk.0.ffn_down.weight"),
                      TENSOR_TYPE_F16);
    check_model_runs(tmp_path("fb.gguf"));
    p.type = SYNTH_TYPE_Q6_K;
    write_ok(&p, tmp_path("fb6.gguf"));
    ck_assert_uint_eq(file_tensor_type(tmp_path("fb6.gguf"), "output.weight"), TENSOR_TYPE_Q8_0);
    p.type = SYNTH_TYPE_Q5_K;
    write_ok(&p, tmp_path("fb5.gguf"));
    ck_assert_uint_eq(file_tensor_type(tmp_path("fb5.gguf"), "output.weight"), TENSOR_TYPE_Q5_1);
    check_model_runs(tmp_path("fb5.gguf"));
    remove_tmp_dir();
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

/* The error's message mentions every one of the given words. */
static void assert_message_names(const corral_error *err, const char *a, const char *b) {
    ck_assert_msg(strstr(err->message, a) != NULL, "message '%s' does not name '%s'", err->message,
                  a);
    if (b)
        ck_assert_msg(strstr(err->message, b) != NULL, "message '%s' does not name '%s'",
                      err->message, b);
}

START_TEST(test_bad_names_rejected) {
    corral_error err = {0};
    synth_params p = synth_params_default();
    ck_assert_int_eq(synth_params_set_preset(&p, "llama-70b", &err), CORRAL_NOT_FOUND);
    assert_message_names(&err, "llama-70b", "tinyllama-1.1b");
    ck_assert_uint_eq(p.n_embd, 256); /* untouched */
    synth_type t = SYNTH_TYPE_F16;
    ck_assert_int_eq(synth_type_parse("q3_k", &t, &err), CORRAL_NOT_FOUND);
    assert_message_names(&err, "q3_k", "q4_k_m");
    ck_assert_int_eq(t, SYNTH_TYPE_F16);
    ck_assert_int_eq(synth_type_parse("Q4_K_M", &t, &err), CORRAL_OK);
    ck_assert_int_eq(t, SYNTH_TYPE_Q4_K_M);
    ck_assert_str_eq(synth_type_name(SYNTH_TYPE_COUNT), "?");
}
END_TEST

START_TEST(test_bad_shapes_rejected) {
    static const struct {
        const char *field;
        uint32_t value;
        const char *named1, *named2;
    } cases[] = {
        {"n_head", 3, "n_embd = 256", "n_head = 3"},     /* 256 % 3 */
        {"n_head_kv", 3, "n_head = 4", "n_head_kv = 3"}, /* 4 % 3 */
        {"n_embd", 0, "n_embd", NULL},                   /* zero */
        {"n_layer", 0, "n_layer", NULL},                 /* zero */
        {"n_ff", 1u << 23, "n_ff", NULL},                /* over the loader's bound */
        {"n_ctx", 0, "n_ctx", NULL},                     /* zero */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth_params p = synth_params_default();
        if (!strcmp(cases[i].field, "n_head")) p.n_head = cases[i].value;
        if (!strcmp(cases[i].field, "n_head_kv")) p.n_head_kv = cases[i].value;
        if (!strcmp(cases[i].field, "n_embd")) p.n_embd = cases[i].value;
        if (!strcmp(cases[i].field, "n_layer")) p.n_layer = cases[i].value;
        if (!strcmp(cases[i].field, "n_ff")) p.n_ff = cases[i].value;
        if (!strcmp(cases[i].field, "n_ctx")) p.n_ctx = cases[i].value;
        corral_error err = {0};
        ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
        assert_message_names(&err, cases[i].named1, cases[i].named2);
        ck_assert_int_eq(synth_write(&p, "/nonexistent/never.gguf", NULL, &err),
                         CORRAL_INVALID_ARGUMENT);
    }
    corral_error err = {0};
    synth_params p = synth_params_default();
    p.n_embd = 264; /* head dimension 264 / 8 = 33: odd, RoPE rotates pairs */
    p.n_head = 8;
    p.n_head_kv = 8;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "head dimension", "33");
    p = synth_params_default();
    snprintf(p.arch, sizeof p.arch, "gpt2");
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "gpt2", "llama");
    p = synth_params_default(); /* a window is gemma3's */
    p.n_swa = 16;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "sliding window 16", "gemma3");
    p = synth_params_default(); /* Llama 3 RoPE is llama's */
    snprintf(p.arch, sizeof p.arch, "qwen3");
    p.rope_llama3_factor = 8.0f;
    p.rope_orig_ctx = 1024;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "Llama 3 RoPE", NULL);
    p = synth_params_default(); /* an odd head size */
    p.head_dim = 33;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "head dimension 33", NULL);
    p = synth_params_default();
    p.type = SYNTH_TYPE_COUNT;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    p = synth_params_default();
    p.rms_eps = 0;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "rms_eps", NULL);
    p = synth_params_default();
    p.rope_base = 1.0f;
    ck_assert_int_eq(synth_validate(&p, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "rope_base", NULL);
    ck_assert_int_eq(synth_validate(NULL, &err), CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_bad_vocab_sources_rejected) {
    make_tmp_dir();
    corral_error err = {0};
    synth_params p = small_params("llama", SYNTH_TYPE_F16);
    /* Missing file. */
    p.vocab_from = "/nonexistent/vocab.gguf";
    ck_assert_int_ne(synth_write(&p, tmp_path("x.gguf"), NULL, &err), CORRAL_OK);
    assert_message_names(&err, "/nonexistent/vocab.gguf", NULL);
    ck_assert_int_eq(access(tmp_path("x.gguf"), F_OK), -1);
    /* More tokens than rows. */
    char vocab_path[4096];
    snprintf(vocab_path, sizeof vocab_path, "%s",
             test_shared_path("vocab/ggml-vocab-llama-spm.gguf"));
    p.vocab_from = vocab_path;
    p.n_vocab = 1000;
    ck_assert_int_eq(synth_write(&p, tmp_path("x.gguf"), NULL, &err), CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "32000", "n_vocab = 1000");
    /* A GGUF file without a vocabulary. */
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_set_str(b, "general.architecture", "llama"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("novocab.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    p.vocab_from = tmp_path("novocab.gguf");
    ck_assert_int_eq(synth_write(&p, tmp_path("x.gguf"), NULL, &err), CORRAL_FORMAT);
    assert_message_names(&err, "tokenizer.ggml.tokens", "novocab.gguf");
    /* An unwritable destination. */
    p.vocab_from = NULL;
    p.n_vocab = 320;
    ck_assert_int_eq(synth_write(&p, "/nonexistent/dir/out.gguf", NULL, &err), CORRAL_IO);
    assert_message_names(&err, "/nonexistent/dir/out.gguf", NULL);
    remove_tmp_dir();
}
END_TEST

/* ---- the builder's streaming tensors --------------------------------------------------------- */

typedef struct fill_state {
    const uint8_t *src;
    int calls;
    int fail;
} fill_state;

static corral_status fill_copy(void *user, const char *name, void *dst, uint64_t size,
                               corral_error *err) {
    fill_state *s = user;
    s->calls++;
    if (s->fail) return corral_error_set(err, CORRAL_CANCELLED, "fill of %s refused", name);
    memcpy(dst, s->src, size);
    return CORRAL_OK;
}

/* A file whose tensors come from fill callbacks is byte-identical to one whose tensors were
 * given as data; a failing fill fails the write and leaves no file (or temporary) behind. */
START_TEST(test_builder_fill_matches_data) {
    make_tmp_dir();
    uint8_t a[3 * 64 * 4], q[2 * 34];
    for (size_t i = 0; i < sizeof a; i++) a[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)(i * 13 + 5);
    const int64_t ne_a[2] = {64, 3}, ne_q[2] = {64, 1};
    corral_error err = {0};
    fill_state sa = {a, 0, 0}, sq = {q, 0, 0};
    for (int mode = 0; mode < 2; mode++) {
        gguf_builder *b = gguf_builder_new();
        ck_assert_int_eq(gguf_builder_set_u32(b, "general.alignment", 64), CORRAL_OK);
        if (mode == 0) {
            ck_assert_int_eq(gguf_builder_add_tensor(b, "a", TENSOR_TYPE_F32, 2, ne_a, a, &err),
                             CORRAL_OK);
            ck_assert_int_eq(gguf_builder_add_tensor(b, "q", TENSOR_TYPE_Q8_0, 1, ne_q, q, &err),
                             CORRAL_OK);
        } else {
            ck_assert_int_eq(gguf_builder_add_tensor_fill(b, "a", TENSOR_TYPE_F32, 2, ne_a,
                                                          fill_copy, &sa, &err),
                             CORRAL_OK);
            ck_assert_int_eq(gguf_builder_add_tensor(b, "q", TENSOR_TYPE_Q8_0, 1, ne_q, q, &err),
                             CORRAL_OK);
        }
        ck_assert_int_eq(gguf_builder_write(b, tmp_path(mode ? "fill.gguf" : "data.gguf"), &err),
                         CORRAL_OK);
        gguf_builder_destroy(&b);
    }
    ck_assert_int_eq(sa.calls, 1);
    ck_assert(files_equal(tmp_path("data.gguf"), tmp_path("fill.gguf")));

    /* All filled, in order, twice the same. */
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(
        gguf_builder_add_tensor_fill(b, "a", TENSOR_TYPE_F32, 2, ne_a, fill_copy, &sa, &err),
        CORRAL_OK);
    ck_assert_int_eq(
        gguf_builder_add_tensor_fill(b, "q", TENSOR_TYPE_Q8_0, 1, ne_q, fill_copy, &sq, &err),
        CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_u32(b, "general.alignment", 64), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("fill2.gguf"), &err), CORRAL_OK);
    ck_assert(files_equal(tmp_path("data.gguf"), tmp_path("fill2.gguf")));
    ck_assert_int_eq(sq.calls, 1);

    /* A refusing fill. */
    sq.fail = 1;
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("fail.gguf"), &err), CORRAL_CANCELLED);
    assert_message_names(&err, "fill of q refused", "fail.gguf");
    ck_assert_int_eq(access(tmp_path("fail.gguf"), F_OK), -1);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("fail.gguf"), NULL), CORRAL_CANCELLED);
    gguf_builder_destroy(&b);
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    while ((e = readdir(d))) ck_assert_msg(!strstr(e->d_name, ".tmp."), "left %s", e->d_name);
    closedir(d);

    /* Arguments. */
    b = gguf_builder_new();
    ck_assert_int_eq(
        gguf_builder_add_tensor_fill(b, "x", TENSOR_TYPE_F32, 2, ne_a, NULL, NULL, &err),
        CORRAL_INVALID_ARGUMENT);
    const int64_t ne_bad[2] = {40, 1};
    ck_assert_int_eq(
        gguf_builder_add_tensor_fill(b, "x", TENSOR_TYPE_Q8_0, 1, ne_bad, fill_copy, &sa, &err),
        CORRAL_INVALID_ARGUMENT);
    assert_message_names(&err, "block size", NULL);
    gguf_builder_destroy(&b);
    remove_tmp_dir();
}
END_TEST

static Suite *synth_suite(void) {
    Suite *s = suite_create("synth");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_every_type_loads_and_runs);
    tcase_add_test(core, test_deterministic_bytes);
    tcase_add_test(core, test_tied_and_separate_output);
    tcase_add_test(core, test_hparams_round_trip);
    tcase_add_test(core, test_pure_types_match_llama_cpp);
    tcase_add_test(core, test_mixes_match_llama_cpp);
    tcase_add_test(core, test_km_layers_over_22_blocks);
    tcase_add_test(core, test_preset_fallbacks);
    tcase_add_test(core, test_presets);
    tcase_add_test(core, test_new_archs_match_llama_cpp);
    tcase_add_test(core, test_vocab_from_padded);
    tcase_add_test(core, test_vocab_from_exact);
    tcase_add_test(core, test_builder_fill_matches_data);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_smallest_generated_vocab);
    tcase_add_test(limits, test_shape_fallbacks_written);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bad_names_rejected);
    tcase_add_test(errors, test_bad_shapes_rejected);
    tcase_add_test(errors, test_bad_vocab_sources_rejected);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(synth_suite)
