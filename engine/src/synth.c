/*
 * synth.c — synthetic models with real shapes and random weights (contract in corral/synth.h).
 *
 * A model is planned first as a list of tensors (name, role, layer, shape, type, seed) in the
 * order llama.cpp's converters write them; the GGUF builder then asks for each tensor's bytes
 * while it writes (gguf_builder_add_tensor_fill), and those are generated row by row on a thread
 * pool: draw the row's floats from a PRNG seeded by (model seed, tensor name, row index), then
 * quantize them with the type's reference quantizer. Because every row has its own seed, the bytes
 * do not depend on how rows are split between threads.
 *
 * The tensor-type rules reproduce llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) for the
 * ftypes offered here; they are summarised in synth.h and written out in synth_mix_rule below.
 */
#include "corral/synth.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "corral/gguf.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"

/* ---- presets ----------------------------------------------------------------------------------
 */

typedef struct synth_preset {
    const char *name;
    const char *arch; /* the rest as in synth_params */
    uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    int tied;
    uint32_t head_dim, n_swa, swa_pattern;
    float rope_llama3_factor;
    uint32_t rope_orig_ctx;
} synth_preset;

/* Shapes from each model's Hugging Face config.json (hidden_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
 * max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings):
 *   TinyLlama/TinyLlama-1.1B-Chat-v1.0: 2048, 22, 32, 4, 5632, 32000, 2048, 10000, 1e-5, false
 *     (k_proj 2048 -> 256 = 4 KV heads of 64).
 *   HuggingFaceTB/SmolLM2-135M: 576, 30, 9, 3, 1536, 49152, 8192, 100000, 1e-5, true.
 *   Qwen/Qwen2-0.5B-Instruct: 896, 24, 14, 2, 4864, 151936, 32768, 1000000, 1e-6, true; Q/K/V
 *     projections carry biases. (The base Qwen2-0.5B says max_position_embeddings 131072; its
 *     GGUF conversions, like the Instruct model's, use 32768.)
 *   Qwen/Qwen3-0.6B: 1024, 28, 16, 8, 3072, 151936, 40960, 1000000, 1e-6, true; head_dim 128
 *     (16 heads of 128 = 2048 wide queries on a 1024 residual).
 *   google/gemma-3-1b-it: 1152, 26, 4, 1, 6912, 262144, 32768, 1000000, 1e-6, true; head_dim
 *     256, sliding_window 512, one global layer in 6 (the GGUF files omit the pattern key: its
 *     default), local layers' rope_local_base_freq 10000 (the default), no rope scaling.
 *   meta-llama/Llama-3.2-1B-Instruct: 2048, 16, 32, 8, 8192, 128256, 131072, 500000, 1e-5, true;
 *     rope_scaling llama3: factor 32, low 1, high 4, original_max_position_embeddings 8192.
 *   microsoft/Phi-3-mini-4k-instruct: 3072, 32, 32, 32, 8192, 32064, 4096, 10000, 1e-5, false. */
#define SHAPE(a, e, l, h, hkv, ff, v, c, base, eps, t)                                             \
    .arch = a, .n_embd = e, .n_layer = l, .n_head = h, .n_head_kv = hkv, .n_ff = ff, .n_vocab = v, \
    .n_ctx = c, .rope_base = base, .rms_eps = eps, .tied = t

static const synth_preset synth_presets[] = {
    {"tinyllama-1.1b", SHAPE("llama", 2048, 22, 32, 4, 5632, 32000, 2048, 1e4f, 1e-5f, 0)},
    {"smollm2-135m", SHAPE("llama", 576, 30, 9, 3, 1536, 49152, 8192, 1e5f, 1e-5f, 1)},
    {"qwen2-0.5b", SHAPE("qwen2", 896, 24, 14, 2, 4864, 151936, 32768, 1e6f, 1e-6f, 1)},
    {"qwen3-0.6b", SHAPE("qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, 1e6f, 1e-6f, 1),
     .head_dim = 128},
    {"gemma3-1b", SHAPE("gemma3", 1152, 26, 4, 1, 6912, 262144, 32768, 1e6f, 1e-6f, 1),
     .head_dim = 256, .n_swa = 512, .swa_pattern = 6},
    {"llama3.2-1b", SHAPE("llama", 2048, 16, 32, 8, 8192, 128256, 131072, 5e5f, 1e-5f, 1),
     .rope_llama3_factor = 32.0f, .rope_orig_ctx = 8192},
    {"phi3-mini", SHAPE("phi3", 3072, 32, 32, 32, 8192, 32064, 4096, 1e4f, 1e-5f, 0)},
};
#undef SHAPE

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

const char *synth_preset_names(void) {
    return "tinyllama-1.1b, smollm2-135m, qwen2-0.5b, qwen3-0.6b, gemma3-1b, llama3.2-1b, "
           "phi3-mini";
}

/* What each architecture's files hold beyond the plain llama block (arch.c says how the engine
 * runs them). */
enum {
    SYNTH_HAS_BIAS = 1u << 0,       /* Q/K/V biases */
    SYNTH_HAS_QK_NORM = 1u << 1,    /* attn_q_norm, attn_k_norm */
    SYNTH_HAS_POST_NORMS = 1u << 2, /* post_attention_norm, post_ffw_norm */
    SYNTH_HAS_FUSED = 1u << 3,      /* attn_qkv and a gate+up ffn_up, no attn_q/k/v, ffn_gate */
    SYNTH_HAS_ROPE_FREQS = 1u << 4, /* rope_freqs.weight (from the parameters, not the arch) */
    SYNTH_HAS_HEAD_KEYS = 1u << 5,  /* attention.key_length / value_length always written */
};

static const struct {
    const char *name;
    uint32_t has;
} synth_archs[] = {
    {"llama", 0},
    {"qwen2", SYNTH_HAS_BIAS},
    {"qwen3", SYNTH_HAS_QK_NORM | SYNTH_HAS_HEAD_KEYS},
    {"gemma3", SYNTH_HAS_QK_NORM | SYNTH_HAS_POST_NORMS | SYNTH_HAS_HEAD_KEYS},
    {"phi3", SYNTH_HAS_FUSED},
};

const char *synth_arch_names(void) {
    return "llama, qwen2, qwen3, gemma3, phi3";
}

/* The arch's bits, with those the parameters add; 0 with *known 0 for an unknown arch. */
static uint32_t synth_has(const synth_params *p, int *known) {
    for (size_t i = 0; i < N_OF(synth_archs); i++)
        if (strcmp(p->arch, synth_archs[i].name) == 0) {
            if (known) *known = 1;
            return synth_archs[i].has | (p->rope_llama3_factor > 0 ? SYNTH_HAS_ROPE_FREQS : 0);
        }
    if (known) *known = 0;
    return 0;
}

static uint32_t synth_head_dim(const synth_params *p) {
    return p->head_dim ? p->head_dim : p->n_embd / p->n_head;
}

/* ---- types -------------------------------------------------------------------------------------
 */

/* llama.cpp's llama_ftype values (general.file_type) of the mixes offered here. */
enum {
    FTYPE_ALL_F32 = 0,
    FTYPE_MOSTLY_F16 = 1,
    FTYPE_MOSTLY_Q4_0 = 2,
    FTYPE_MOSTLY_Q4_1 = 3,
    FTYPE_MOSTLY_Q8_0 = 7,
    FTYPE_MOSTLY_Q5_0 = 8,
    FTYPE_MOSTLY_Q5_1 = 9,
    FTYPE_MOSTLY_Q4_K_S = 14,
    FTYPE_MOSTLY_Q4_K_M = 15,
    FTYPE_MOSTLY_Q5_K_S = 16,
    FTYPE_MOSTLY_Q5_K_M = 17,
    FTYPE_MOSTLY_Q6_K = 18,
    FTYPE_MOSTLY_BF16 = 32,
};

typedef struct synth_type_desc {
    const char *name;
    tensor_type base; /* the type of every 2-D weight before the mix rules */
    uint32_t ftype;
} synth_type_desc;

static const synth_type_desc synth_types[SYNTH_TYPE_COUNT] = {
    [SYNTH_TYPE_F32] = {"f32", TENSOR_TYPE_F32, FTYPE_ALL_F32},
    [SYNTH_TYPE_F16] = {"f16", TENSOR_TYPE_F16, FTYPE_MOSTLY_F16},
    [SYNTH_TYPE_BF16] = {"bf16", TENSOR_TYPE_BF16, FTYPE_MOSTLY_BF16},
    [SYNTH_TYPE_Q8_0] = {"q8_0", TENSOR_TYPE_Q8_0, FTYPE_MOSTLY_Q8_0},
    [SYNTH_TYPE_Q4_0] = {"q4_0", TENSOR_TYPE_Q4_0, FTYPE_MOSTLY_Q4_0},
    [SYNTH_TYPE_Q4_1] = {"q4_1", TENSOR_TYPE_Q4_1, FTYPE_MOSTLY_Q4_1},
    [SYNTH_TYPE_Q5_0] = {"q5_0", TENSOR_TYPE_Q5_0, FTYPE_MOSTLY_Q5_0},
    [SYNTH_TYPE_Q5_1] = {"q5_1", TENSOR_TYPE_Q5_1, FTYPE_MOSTLY_Q5_1},
    [SYNTH_TYPE_Q4_K] = {"q4_k", TENSOR_TYPE_Q4_K, FTYPE_MOSTLY_Q4_K_S},
    [SYNTH_TYPE_Q5_K] = {"q5_k", TENSOR_TYPE_Q5_K, FTYPE_MOSTLY_Q5_K_S},
    [SYNTH_TYPE_Q6_K] = {"q6_k", TENSOR_TYPE_Q6_K, FTYPE_MOSTLY_Q6_K},
    [SYNTH_TYPE_Q4_K_M] = {"q4_k_m", TENSOR_TYPE_Q4_K, FTYPE_MOSTLY_Q4_K_M},
    [SYNTH_TYPE_Q5_K_M] = {"q5_k_m", TENSOR_TYPE_Q5_K, FTYPE_MOSTLY_Q5_K_M},
};

#define SYNTH_TYPE_LIST \
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m"

const char *synth_type_name(synth_type type) {
    return (unsigned)type < SYNTH_TYPE_COUNT ? synth_types[type].name : "?";
}

corral_status synth_type_parse(const char *name, synth_type *out, corral_error *err) {
    for (int i = 0; name && i < SYNTH_TYPE_COUNT; i++) {
        if (strcasecmp(name, synth_types[i].name) == 0) {
            *out = (synth_type)i;
            return CORRAL_OK;
        }
    }
    return corral_error_set(err, CORRAL_NOT_FOUND, "unknown type '%s' (known: %s)",
                            name ? name : "(null)", SYNTH_TYPE_LIST);
}

/* ---- parameters ------------------------------------------------------------------------------ */

synth_params synth_params_default(void) {
    synth_params p = {
        .n_embd = 256,
        .n_layer = 2,
        .n_head = 4,
        .n_head_kv = 2,
        .n_ff = 768,
        .n_vocab = 512,
        .n_ctx = 512,
        .rope_base = 10000.0f,
        .rms_eps = 1e-5f,
        .tied = 0,
        .type = SYNTH_TYPE_F32,
        .seed = 1,
    };
    snprintf(p.arch, sizeof p.arch, "llama");
    return p;
}

corral_status synth_params_set_preset(synth_params *p, const char *preset, corral_error *err) {
    for (size_t i = 0; preset && i < N_OF(synth_presets); i++) {
        const synth_preset *s = &synth_presets[i];
        if (strcasecmp(preset, s->name) != 0) continue;
        snprintf(p->arch, sizeof p->arch, "%s", s->arch);
        p->n_embd = s->n_embd;
        p->n_layer = s->n_layer;
        p->n_head = s->n_head;
        p->n_head_kv = s->n_head_kv;
        p->n_ff = s->n_ff;
        p->n_vocab = s->n_vocab;
        p->n_ctx = s->n_ctx;
        p->rope_base = s->rope_base;
        p->rms_eps = s->rms_eps;
        p->tied = s->tied;
        p->head_dim = s->head_dim;
        p->n_swa = s->n_swa;
        p->swa_pattern = s->swa_pattern;
        p->rope_llama3_factor = s->rope_llama3_factor;
        p->rope_orig_ctx = s->rope_orig_ctx;
        return CORRAL_OK;
    }
    return corral_error_set(err, CORRAL_NOT_FOUND, "unknown preset '%s' (known: %s)",
                            preset ? preset : "(null)", synth_preset_names());
}

/* Tokens every generated vocabulary starts with: <unk>, <s>, </s> and the 256 byte tokens. */
#define SYNTH_VOCAB_FIXED 259u

corral_status synth_validate(const synth_params *p, corral_error *err) {
    if (!p) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "synth: NULL parameters");
    int known;
    synth_has(p, &known);
    if (!known)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "unknown arch '%s' (known: %s)",
                                p->arch, synth_arch_names());
    if ((unsigned)p->type >= SYNTH_TYPE_COUNT)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "unknown type id %d (known: %s)",
                                (int)p->type, SYNTH_TYPE_LIST);
    /* The same bounds as the loader's (model.c), so that whatever is written also loads. */
    const struct {
        const char *name;
        uint32_t value, max;
    } dims[] = {
        {"n_embd", p->n_embd, 1u << 20}, {"n_layer", p->n_layer, 4096},
        {"n_head", p->n_head, 4096},     {"n_head_kv", p->n_head_kv, 4096},
        {"n_ff", p->n_ff, 1u << 22},     {"n_vocab", p->n_vocab, 1u << 24},
        {"n_ctx", p->n_ctx, UINT32_MAX},
    };
    for (size_t i = 0; i < N_OF(dims); i++) {
        if (dims[i].value == 0 || dims[i].value > dims[i].max)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s = %u is out of range 1..%u",
                                    dims[i].name, dims[i].value, dims[i].max);
    }
    if (p->head_dim == 0 && p->n_embd % p->n_head != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "n_embd = %u is not divisible by n_head = %u", p->n_embd,
                                p->n_head);
    if (p->n_head % p->n_head_kv != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "n_head = %u is not a multiple of n_head_kv = %u", p->n_head,
                                p->n_head_kv);
    uint32_t head_dim = synth_head_dim(p);
    if (head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "head dimension %u must be even and in 2..1024", head_dim);
    if ((p->n_swa > 0) != (strcmp(p->arch, "gemma3") == 0 && p->n_swa > 0) ||
        p->n_swa > (1u << 24) || p->swa_pattern > p->n_layer + 1)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "sliding window %u, pattern %u: only for gemma3, a window up to "
                                "2^24 and a pattern up to n_layer + 1",
                                p->n_swa, p->swa_pattern);
    if (p->rope_llama3_factor != 0.0f &&
        (strcmp(p->arch, "llama") != 0 ||
         !(p->rope_llama3_factor >= 1.0f && p->rope_llama3_factor <= 1024.0f) ||
         p->rope_orig_ctx == 0))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "Llama 3 RoPE factor %g: only for llama, in 1..1024, with an "
                                "original context",
                                (double)p->rope_llama3_factor);
    if (!(p->rope_base > 1.0f && p->rope_base < 1e30f))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "rope_base = %g must be above 1",
                                (double)p->rope_base);
    if (!(p->rms_eps > 0.0f && p->rms_eps < 1.0f))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "rms_eps = %g is out of range (0, 1)",
                                (double)p->rms_eps);
    if (!p->vocab_from && p->n_vocab < SYNTH_VOCAB_FIXED)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "n_vocab = %u is too small for a generated vocabulary (at least "
                                "%u: <unk>, <s>, </s> and 256 byte tokens)",
                                p->n_vocab, SYNTH_VOCAB_FIXED);
    if (p->n_threads > THREADPOOL_MAX_THREADS)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "n_threads = %u exceeds %u",
                                p->n_threads, THREADPOOL_MAX_THREADS);
    return CORRAL_OK;
}

/* ---- the tensors of a model ------------------------------------------------------------------ */

typedef enum synth_role {
    ROLE_TOKEN_EMBD,
    ROLE_ROPE_FREQS,
    ROLE_OUTPUT_NORM,
    ROLE_OUTPUT,
    ROLE_ATTN_NORM,
    ROLE_ATTN_Q,
    ROLE_ATTN_Q_BIAS,
    ROLE_ATTN_Q_NORM,
    ROLE_ATTN_K,
    ROLE_ATTN_K_BIAS,
    ROLE_ATTN_K_NORM,
    ROLE_ATTN_V,
    ROLE_ATTN_V_BIAS,
    ROLE_ATTN_QKV,
    ROLE_ATTN_OUT,
    ROLE_ATTN_POST_NORM,
    ROLE_FFN_NORM,
    ROLE_FFN_GATE,
    ROLE_FFN_UP,
    ROLE_FFN_DOWN,
    ROLE_FFN_POST_NORM,
} synth_role;

/* Symbolic dimensions, resolved against the parameters. */
typedef enum synth_dim {
    DIM_ONE,
    DIM_EMBD,
    DIM_Q,   /* n_head * head_dim */
    DIM_KV,  /* n_head_kv * head_dim */
    DIM_QKV, /* DIM_Q + 2 * DIM_KV */
    DIM_HEAD,
    DIM_ROT_HALF, /* head_dim / 2 */
    DIM_FF,
    DIM_FF2, /* 2 * n_ff */
    DIM_VOCAB
} synth_dim;

/* How a tensor's values are drawn. */
typedef enum synth_init {
    INIT_WEIGHT,     /* ~N(0, 0.02^2) */
    INIT_NORM,       /* 1 + U(-0.1, 0.1) */
    INIT_ROPE_FREQS, /* Llama 3's factors (synth_rope_freqs) */
} synth_init;

typedef struct synth_tensor_desc {
    synth_role role;
    const char *name; /* per-layer names have one %u */
    synth_dim ne0, ne1;
    synth_init init;
    bool per_layer;
    uint32_t need;    /* SYNTH_HAS_* bits the model must have for the tensor to exist */
    uint32_t without; /* SYNTH_HAS_* bits that remove it */
} synth_tensor_desc;

/* In the order llama.cpp's converters write them: the embedding, each block, the head. */
static const synth_tensor_desc synth_tensor_table[] = {
    {ROLE_TOKEN_EMBD, "token_embd.weight", DIM_EMBD, DIM_VOCAB, INIT_WEIGHT, false, 0, 0},
    {ROLE_ROPE_FREQS, "rope_freqs.weight", DIM_ROT_HALF, DIM_ONE, INIT_ROPE_FREQS, false,
     SYNTH_HAS_ROPE_FREQS, 0},
    {ROLE_ATTN_NORM, "blk.%u.attn_norm.weight", DIM_EMBD, DIM_ONE, INIT_NORM, true, 0, 0},
    {ROLE_ATTN_Q, "blk.%u.attn_q.weight", DIM_EMBD, DIM_Q, INIT_WEIGHT, true, 0, SYNTH_HAS_FUSED},
    {ROLE_ATTN_Q_BIAS, "blk.%u.attn_q.bias", DIM_Q, DIM_ONE, INIT_WEIGHT, true, SYNTH_HAS_BIAS, 0},
    {ROLE_ATTN_Q_NORM, "blk.%u.attn_q_norm.weight", DIM_HEAD, DIM_ONE, INIT_NORM, true,
     SYNTH_HAS_QK_NORM, 0},
    {ROLE_ATTN_K, "blk.%u.attn_k.weight", DIM_EMBD, DIM_KV, INIT_WEIGHT, true, 0, SYNTH_HAS_FUSED},
    {ROLE_ATTN_K_BIAS, "blk.%u.attn_k.bias", DIM_KV, DIM_ONE, INIT_WEIGHT, true, SYNTH_HAS_BIAS, 0},
    {ROLE_ATTN_K_NORM, "blk.%u.attn_k_norm.weight", DIM_HEAD, DIM_ONE, INIT_NORM, true,
     SYNTH_HAS_QK_NORM, 0},
    {ROLE_ATTN_V, "blk.%u.attn_v.weight", DIM_EMBD, DIM_KV, INIT_WEIGHT, true, 0, SYNTH_HAS_FUSED},
    {ROLE_ATTN_V_BIAS, "blk.%u.attn_v.bias", DIM_KV, DIM_ONE, INIT_WEIGHT, true, SYNTH_HAS_BIAS, 0},
    {ROLE_ATTN_QKV, "blk.%u.attn_qkv.weight", DIM_EMBD, DIM_QKV, INIT_WEIGHT, true, SYNTH_HAS_FUSED,
     0},
    {ROLE_ATTN_OUT, "blk.%u.attn_output.weight", DIM_Q, DIM_EMBD, INIT_WEIGHT, true, 0, 0},
    {ROLE_ATTN_POST_NORM, "blk.%u.post_attention_norm.weight", DIM_EMBD, DIM_ONE, INIT_NORM, true,
     SYNTH_HAS_POST_NORMS, 0},
    {ROLE_FFN_NORM, "blk.%u.ffn_norm.weight", DIM_EMBD, DIM_ONE, INIT_NORM, true, 0, 0},
    {ROLE_FFN_GATE, "blk.%u.ffn_gate.weight", DIM_EMBD, DIM_FF, INIT_WEIGHT, true, 0,
     SYNTH_HAS_FUSED},
    {ROLE_FFN_UP, "blk.%u.ffn_up.weight", DIM_EMBD, DIM_FF, INIT_WEIGHT, true, 0, SYNTH_HAS_FUSED},
    {ROLE_FFN_UP, "blk.%u.ffn_up.weight", DIM_EMBD, DIM_FF2, INIT_WEIGHT, true, SYNTH_HAS_FUSED, 0},
    {ROLE_FFN_DOWN, "blk.%u.ffn_down.weight", DIM_FF, DIM_EMBD, INIT_WEIGHT, true, 0, 0},
    {ROLE_FFN_POST_NORM, "blk.%u.post_ffw_norm.weight", DIM_EMBD, DIM_ONE, INIT_NORM, true,
     SYNTH_HAS_POST_NORMS, 0},
    {ROLE_OUTPUT_NORM, "output_norm.weight", DIM_EMBD, DIM_ONE, INIT_NORM, false, 0, 0},
    {ROLE_OUTPUT, "output.weight", DIM_EMBD, DIM_VOCAB, INIT_WEIGHT, false, 0, 0},
};

static int64_t synth_dim_value(const synth_params *p, synth_dim d) {
    const int64_t hd = synth_head_dim(p);
    switch (d) {
        case DIM_ONE:
            return 1;
        case DIM_EMBD:
            return p->n_embd;
        case DIM_Q:
            return (int64_t)p->n_head * hd;
        case DIM_KV:
            return (int64_t)p->n_head_kv * hd;
        case DIM_QKV:
            return ((int64_t)p->n_head + 2 * (int64_t)p->n_head_kv) * hd;
        case DIM_HEAD:
            return hd;
        case DIM_ROT_HALF:
            return hd / 2;
        case DIM_FF:
            return p->n_ff;
        case DIM_FF2:
            return 2 * (int64_t)p->n_ff;
        case DIM_VOCAB:
            return p->n_vocab;
    }
    return 1;
}

/* Whether the descriptor's tensor exists in a model with parameters p. */
static bool synth_desc_present(const synth_params *p, const synth_tensor_desc *d) {
    const uint32_t has = synth_has(p, NULL);
    if ((has & d->need) != d->need || (has & d->without)) return false;
    if (d->role == ROLE_OUTPUT && p->tied) return false;
    return true;
}

/* Llama 3's RoPE factors (llama.cpp's converter): pair i of a head of head_dim has the frequency
 * base^(-2i/head_dim) and the wavelength 2 pi / freq; wavelengths shorter than the original
 * context / 4 keep their frequency (factor 1), longer than the original context are divided by
 * the factor, and those between are interpolated. */
static float synth_rope_freq(const synth_params *p, int64_t i) {
    const double hd = synth_head_dim(p), orig = p->rope_orig_ctx, factor = p->rope_llama3_factor;
    const double low = 1.0, high = 4.0;
    const double freq = 1.0 / pow((double)p->rope_base, (double)(2 * i) / hd);
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < orig / high) return 1.0f;
    if (wavelen > orig / low) return (float)factor;
    const double smooth = (orig / wavelen - low) / (high - low);
    return (float)(1.0 / ((1.0 - smooth) / factor + smooth));
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between
 * get more bits in the _M mixes. */
static bool synth_use_more_bits(uint32_t i, uint32_t n) {
    return i < n / 8 || i >= 7 * n / 8 || ((int64_t)i - (int64_t)(n / 8)) % 3 == 2;
}

static int64_t synth_block(tensor_type t) {
    return tensor_type_get_traits(t)->block_size;
}

/* llama_tensor_get_type_impl, restricted to the ftypes of synth_types, non-MoE, non-Falcon
 * models without an importance matrix. `t` is the ftype's base type. */
static tensor_type synth_mix_rule(const synth_params *p, synth_role role, uint32_t layer,
                                  int64_t ne0, tensor_type t) {
    const uint32_t ftype = synth_types[p->type].ftype;
    const bool km = ftype == FTYPE_MOSTLY_Q4_K_M || ftype == FTYPE_MOSTLY_Q5_K_M;
    /* With tied embeddings token_embd is the output projection, and is typed as one. */
    if (role == ROLE_OUTPUT || (p->tied && role == ROLE_TOKEN_EMBD)) {
        if (ne0 % synth_block(t) != 0) return TENSOR_TYPE_Q8_0;
        return t == TENSOR_TYPE_Q8_0 ? TENSOR_TYPE_Q8_0 : TENSOR_TYPE_Q6_K;
    }
    /* llama.cpp counts a fused attn_qkv as the layer's attn_v. */
    if (role == ROLE_ATTN_V || role == ROLE_ATTN_QKV) {
        if (km && synth_use_more_bits(layer, p->n_layer)) return TENSOR_TYPE_Q6_K;
        if (ftype == FTYPE_MOSTLY_Q4_K_S && layer < 4) return TENSOR_TYPE_Q5_K;
    }
    if (role == ROLE_FFN_DOWN) {
        if (km && synth_use_more_bits(layer, p->n_layer)) return TENSOR_TYPE_Q6_K;
        if (ftype == FTYPE_MOSTLY_Q4_K_S && layer < p->n_layer / 8) return TENSOR_TYPE_Q5_K;
    }
    return t;
}

/* llama.cpp's fallbacks for rows that are not a multiple of the type's block. */
static const struct {
    tensor_type from, to;
} synth_fallbacks[] = {
    {TENSOR_TYPE_Q4_K, TENSOR_TYPE_Q5_0},
    {TENSOR_TYPE_Q5_K, TENSOR_TYPE_Q5_1},
    {TENSOR_TYPE_Q6_K, TENSOR_TYPE_Q8_0},
};

static tensor_type synth_shape_fallback(tensor_type t, int64_t ne0) {
    if (ne0 % synth_block(t) == 0) return t;
    for (size_t i = 0; i < N_OF(synth_fallbacks); i++) {
        if (synth_fallbacks[i].from == t) {
            tensor_type f = synth_fallbacks[i].to;
            return ne0 % synth_block(f) == 0 ? f : TENSOR_TYPE_F16;
        }
    }
    return TENSOR_TYPE_F16;
}

static tensor_type synth_choose_type(const synth_params *p, const synth_tensor_desc *d,
                                     uint32_t layer) {
    if (d->ne1 == DIM_ONE) return TENSOR_TYPE_F32;
    tensor_type t = synth_types[p->type].base;
    if (!tensor_type_get_traits(t)->is_quantized) return t;
    const int64_t ne0 = synth_dim_value(p, d->ne0);
    if (!p->pure) t = synth_mix_rule(p, d->role, layer, ne0, t);
    return synth_shape_fallback(t, ne0);
}

int32_t synth_tensor_type(const synth_params *p, const char *tensor) {
    if (!p || !tensor || (unsigned)p->type >= SYNTH_TYPE_COUNT || p->n_head == 0) return -1;
    for (size_t i = 0; i < N_OF(synth_tensor_table); i++) {
        const synth_tensor_desc *d = &synth_tensor_table[i];
        if (!synth_desc_present(p, d)) continue;
        uint32_t layer = 0;
        if (d->per_layer) {
            /* "blk.%u.<suffix>": match the suffix after the layer number. */
            const char *suffix = strchr(strchr(d->name, '.') + 1, '.');
            char *end;
            if (strncmp(tensor, "blk.", 4) != 0) continue;
            unsigned long l = strtoul(tensor + 4, &end, 10);
            if (end == tensor + 4 || strcmp(end, suffix) != 0 || l >= p->n_layer) continue;
            layer = (uint32_t)l;
        } else if (strcmp(tensor, d->name) != 0) {
            continue;
        }
        return (int32_t)synth_choose_type(p, d, layer);
    }
    return -1;
}

/* ---- values ---------------------------------------------------------------------------------- */

/* SplitMix64: a fast generator whose every output is a good hash of its counter, so a row can be
 * started anywhere from (tensor seed, row) with no sequential state. */
static uint64_t synth_splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t synth_hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Standard deviation of a sum of four 16-bit uniforms, and its mean. */
#define SYNTH_IH_MEAN  (4.0f * 32767.5f)
#define SYNTH_IH_SIGMA 37837.23f

#define SYNTH_WEIGHT_STD 0.02f
#define SYNTH_NORM_SPAN  0.1f

/* One row of values. Weights are Irwin-Hall(4) approximations of a normal: the sum of four 16-bit
 * uniforms from one 64-bit draw, centered and scaled — integer-exact, so the same on every
 * machine and compiler, and one PRNG step per value. */
static void synth_fill_values(synth_init init, uint64_t tensor_seed, int64_t row, float *dst,
                              int64_t n) {
    uint64_t state = tensor_seed ^ ((uint64_t)row * 0xd1b54a32d192ed03ull);
    if (init == INIT_NORM) {
        for (int64_t i = 0; i < n; i++) {
            float u = (float)(synth_splitmix(&state) >> 40) * (1.0f / 16777216.0f);
            dst[i] = 1.0f + SYNTH_NORM_SPAN * (2.0f * u - 1.0f);
        }
        return;
    }
    const float scale = SYNTH_WEIGHT_STD / SYNTH_IH_SIGMA;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = synth_splitmix(&state);
        uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                     (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
        dst[i] = ((float)s - SYNTH_IH_MEAN) * scale;
    }
}

/* ---- writing --------------------------------------------------------------------------------- */

typedef struct synth_tensor synth_tensor;

/* State shared by the fills of one synth_write. */
typedef struct synth_job {
    const synth_params *p;
    threadpool *pool;
    float *scratch; /* n_threads rows of max_ne0 floats */
    int64_t max_ne0;
    const synth_tensor *cur; /* the tensor being filled */
    uint8_t *dst;
    const corral_progress *progress; /* synth_params.progress */
    uint64_t n_filled, n_tensors;
} synth_job;

struct synth_tensor {
    char name[64];
    const synth_tensor_desc *desc;
    uint32_t layer;
    tensor_type type;
    int64_t ne[2];
    uint64_t seed;
    synth_job *job;
};

static void synth_fill_rows(void *arg, uint32_t ith, uint32_t nth) {
    synth_job *job = arg;
    const synth_tensor *t = job->cur;
    const tensor_type_traits *tt = tensor_type_get_traits(t->type);
    const size_t row_bytes = tensor_row_size(t->type, t->ne[0]);
    float *row = job->scratch + (size_t)ith * (size_t)job->max_ne0;
    const int64_t r0 = t->ne[1] * ith / nth, r1 = t->ne[1] * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        if (t->desc->init == INIT_ROPE_FREQS)
            for (int64_t i = 0; i < t->ne[0]; i++) row[i] = synth_rope_freq(job->p, i);
        else
            synth_fill_values(t->desc->init, t->seed, r, row, t->ne[0]);
        tt->from_float(row, job->dst + (size_t)r * row_bytes, t->ne[0]);
    }
}

static corral_status synth_fill(void *user, const char *name, void *dst, uint64_t size,
                                corral_error *err) {
    synth_tensor *t = user;
    (void)name;
    if (size != tensor_row_size(t->type, t->ne[0]) * (uint64_t)t->ne[1])
        return corral_error_set(err, CORRAL_INTERNAL, "tensor %s: size mismatch", t->name);
    t->job->cur = t;
    t->job->dst = dst;
    threadpool_run(t->job->pool, synth_fill_rows, t->job);
    corral_progress_report(t->job->progress, ++t->job->n_filled, t->job->n_tensors);
    return CORRAL_OK;
}

/* The model's tensors in file order. Caller frees *out. */
static corral_status synth_plan(const synth_params *p, synth_job *job, synth_tensor **out,
                                size_t *n_out, corral_error *err) {
    size_t n = 0;
    for (size_t i = 0; i < N_OF(synth_tensor_table); i++) {
        const synth_tensor_desc *d = &synth_tensor_table[i];
        if (synth_desc_present(p, d)) n += d->per_layer ? p->n_layer : 1;
    }
    synth_tensor *ts = calloc(n, sizeof *ts);
    if (!ts) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    size_t k = 0;
    /* Globals before the blocks, the head after them: walk the table in three passes. */
    for (int pass = 0; pass < 3; pass++) {
        uint32_t n_layers = pass == 1 ? p->n_layer : 1;
        for (uint32_t il = 0; il < n_layers; il++) {
            for (size_t i = 0; i < N_OF(synth_tensor_table); i++) {
                const synth_tensor_desc *d = &synth_tensor_table[i];
                bool head = d->role == ROLE_OUTPUT || d->role == ROLE_OUTPUT_NORM;
                int want = d->per_layer ? 1 : head ? 2 : 0;
                if (want != pass || !synth_desc_present(p, d)) continue;
                synth_tensor *t = &ts[k++];
                snprintf(t->name, sizeof t->name, d->name, il);
                t->desc = d;
                t->layer = il;
                t->type = synth_choose_type(p, d, il);
                t->ne[0] = synth_dim_value(p, d->ne0);
                t->ne[1] = synth_dim_value(p, d->ne1);
                uint64_t s = p->seed ^ synth_hash_name(t->name);
                t->seed = synth_splitmix(&s);
                t->job = job;
            }
        }
    }
    *out = ts;
    *n_out = k;
    return CORRAL_OK;
}

/* A generated SentencePiece vocabulary: <unk>, <s>, </s>, <0x00>..<0xFF>, then filler pieces
 * enumerated over "▁" and a..z by length (a, b, ..., ▁a, ...), so that every piece can be built
 * by merging shorter ones. */
static corral_status synth_vocab_generated(gguf_builder *b, uint32_t n_vocab, corral_error *err) {
    static const char *const symbols[] = {
        "\xe2\x96\x81",
        "a",
        "b",
        "c",
        "d",
        "e",
        "f",
        "g",
        "h",
        "i",
        "j",
        "k",
        "l",
        "m",
        "n",
        "o",
        "p",
        "q",
        "r",
        "s",
        "t",
        "u",
        "v",
        "w",
        "x",
        "y",
        "z",
    };
    const uint32_t n_sym = N_OF(symbols);
    char **texts = calloc(n_vocab, sizeof *texts);
    float *scores = calloc(n_vocab, sizeof *scores);
    int32_t *types = calloc(n_vocab, sizeof *types);
    /* Pieces are at most 7 symbols of 3 bytes for any n_vocab the validator allows. */
    char *pool = malloc((size_t)n_vocab * 24);
    corral_status st = CORRAL_OK;
    if (!texts || !scores || !types || !pool) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
        goto done;
    }
    char *w = pool;
    uint32_t digits[8] = {0}, len = 1;
    for (uint32_t i = 0; i < n_vocab; i++) {
        texts[i] = w;
        if (i < 3) {
            w += sprintf(w, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>") + 1;
            types[i] = i == 0 ? TOK_TYPE_UNKNOWN : TOK_TYPE_CONTROL;
            continue;
        }
        if (i < SYNTH_VOCAB_FIXED) {
            w += sprintf(w, "<0x%02X>", i - 3) + 1;
            types[i] = TOK_TYPE_BYTE;
            continue;
        }
        for (uint32_t k = 0; k < len; k++) w += sprintf(w, "%s", symbols[digits[k]]);
        *w++ = '\0';
        types[i] = TOK_TYPE_NORMAL;
        scores[i] = -(float)(i - SYNTH_VOCAB_FIXED);
        /* Next piece: count in base n_sym over len digits, then grow by one. */
        uint32_t k = len;
        while (k > 0 && ++digits[k - 1] == n_sym) digits[--k] = 0;
        if (k == 0) {
            len++;
            for (uint32_t j = 0; j < len; j++) digits[j] = 0;
        }
    }
    const uint8_t yes = 1, no = 0;
    if (gguf_builder_set_str(b, "tokenizer.ggml.model", "llama") ||
        gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", (const char *const *)texts,
                                   n_vocab) ||
        gguf_builder_set_array(b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n_vocab) ||
        gguf_builder_set_array(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n_vocab) ||
        gguf_builder_set_u32(b, "tokenizer.ggml.unknown_token_id", 0) ||
        gguf_builder_set_u32(b, "tokenizer.ggml.bos_token_id", 1) ||
        gguf_builder_set_u32(b, "tokenizer.ggml.eos_token_id", 2) ||
        gguf_builder_set_bool(b, "tokenizer.ggml.add_bos_token", yes) ||
        gguf_builder_set_bool(b, "tokenizer.ggml.add_eos_token", no))
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
done:
    free(texts);
    free(scores);
    free(types);
    free(pool);
    return st;
}

#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TYPES  "tokenizer.ggml.token_type"

/* Rewrite the token list (and scores and types, where present) of a copied vocabulary with
 * n_vocab - n_tok unused "[PAD<i>]" tokens appended, as Hugging Face converters pad vocabularies
 * that are smaller than the embedding. */
static corral_status synth_vocab_pad(gguf_builder *b, const gguf_file *src, uint64_t kv_tokens,
                                     uint32_t n_tok, uint32_t n_vocab, corral_error *err) {
    const char *path = gguf_path(src);
    size_t bytes = 0;
    for (uint32_t i = 0; i < n_tok; i++) {
        gguf_str s = gguf_array_str(src, kv_tokens, i);
        if (memchr(s.data, '\0', s.len))
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: token %u contains a NUL byte; cannot pad its vocabulary",
                                    path, i);
        /* A token spelled like one of the pads would make the vocabulary ambiguous. */
        char text[24];
        unsigned long v;
        int used = 0;
        if (s.len < sizeof text) {
            memcpy(text, s.data, (size_t)s.len);
            text[s.len] = '\0';
        }
        if (s.len < sizeof text && sscanf(text, "[PAD%lu]%n", &v, &used) == 1 &&
            (size_t)used == s.len && v >= n_tok && v < n_vocab)
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: token %u is already named [PAD%lu]; cannot pad", path, i,
                                    v);
        bytes += (size_t)s.len + 1;
    }
    bytes += (size_t)(n_vocab - n_tok) * 24;
    char **texts = calloc(n_vocab, sizeof *texts);
    char *pool = malloc(bytes);
    float *scores = calloc(n_vocab, sizeof *scores);
    int32_t *types = calloc(n_vocab, sizeof *types);
    corral_status st = CORRAL_OK;
    if (!texts || !pool || !scores || !types) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
        goto done;
    }
    char *w = pool;
    for (uint32_t i = 0; i < n_vocab; i++) {
        texts[i] = w;
        if (i < n_tok) {
            gguf_str s = gguf_array_str(src, kv_tokens, i);
            memcpy(w, s.data, (size_t)s.len);
            w += s.len;
            *w++ = '\0';
        } else {
            w += sprintf(w, "[PAD%u]", i) + 1;
        }
    }
    if (gguf_builder_set_str_array(b, KEY_TOKENS, (const char *const *)texts, n_vocab)) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
        goto done;
    }
    gguf_type elem;
    uint64_t count;
    if (gguf_find_key(src, KEY_SCORES) >= 0) {
        if ((st = gguf_get_array(src, KEY_SCORES, &elem, &count, err)) ||
            (st = gguf_array_copy_f32(src, KEY_SCORES, scores, n_tok, err)))
            goto done;
        if (gguf_builder_set_array(b, KEY_SCORES, GGUF_TYPE_FLOAT32, scores, n_vocab)) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
            goto done;
        }
    }
    if (gguf_find_key(src, KEY_TYPES) >= 0) {
        if ((st = gguf_array_copy_i32(src, KEY_TYPES, types, n_tok, err))) goto done;
        for (uint32_t i = n_tok; i < n_vocab; i++) types[i] = TOK_TYPE_UNUSED;
        if (gguf_builder_set_array(b, KEY_TYPES, GGUF_TYPE_INT32, types, n_vocab)) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for the vocabulary");
            goto done;
        }
    }
done:
    free(texts);
    free(pool);
    free(scores);
    free(types);
    return st;
}

/* Copy every tokenizer.* key of path, padding the token list up to n_vocab. */
static corral_status synth_vocab_copy(gguf_builder *b, const char *path, uint32_t n_vocab,
                                      corral_error *err) {
    gguf_file *src = gguf_open(path, err);
    if (!src) return err ? err->status : CORRAL_IO;
    corral_status st;
    int64_t kv_tokens = gguf_find_key(src, KEY_TOKENS);
    gguf_type elem = GGUF_TYPE_COUNT;
    uint64_t n_tok = 0;
    if (kv_tokens < 0) {
        st = corral_error_set(err, CORRAL_FORMAT, "%s: no vocabulary (key %s is missing)", path,
                              KEY_TOKENS);
        goto done;
    }
    if ((st = gguf_get_array(src, KEY_TOKENS, &elem, &n_tok, err))) goto done;
    if (elem != GGUF_TYPE_STRING || n_tok == 0) {
        st = corral_error_set(err, CORRAL_FORMAT, "%s: %s is not a non-empty array of strings",
                              path, KEY_TOKENS);
        goto done;
    }
    if (n_tok > n_vocab) {
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "%s: the vocabulary has %" PRIu64 " tokens, more than n_vocab = %u "
                              "(the embedding's rows); give a larger n_vocab",
                              path, n_tok, n_vocab);
        goto done;
    }
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        gguf_str key = gguf_kv_key(src, i);
        if (key.len < 10 || memcmp(key.data, "tokenizer.", 10) != 0) continue;
        if (gguf_builder_copy_kv(b, src, i) != CORRAL_OK) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory copying %s", path);
            goto done;
        }
    }
    if (n_tok < n_vocab)
        st = synth_vocab_pad(b, src, (uint64_t)kv_tokens, (uint32_t)n_tok, n_vocab, err);
done:
    gguf_destroy(&src);
    return st;
}

/* general.* and <arch>.* keys: everything model_load reads. */
static corral_status synth_set_hparams(gguf_builder *b, const synth_params *p) {
    char name[160];
    if (p->name[0]) {
        snprintf(name, sizeof name, "%s", p->name);
    } else {
        snprintf(name, sizeof name, "synth-%s %ux%u %s (random weights, seed %" PRIu64 ")", p->arch,
                 p->n_layer, p->n_embd, synth_types[p->type].name, p->seed);
    }
    const char *a = p->arch;
    char key[96];
    corral_status st = CORRAL_OK;
#define SET(fn, suffix, v)                               \
    do {                                                 \
        snprintf(key, sizeof key, "%s.%s", a, (suffix)); \
        if (st == CORRAL_OK) st = fn(b, key, (v));       \
    } while (0)
    st = gguf_builder_set_str(b, "general.architecture", a);
    if (st == CORRAL_OK) st = gguf_builder_set_str(b, "general.name", name);
    if (st == CORRAL_OK)
        st = gguf_builder_set_u32(b, "general.file_type", synth_types[p->type].ftype);
    if (st == CORRAL_OK) st = gguf_builder_set_u32(b, "general.quantization_version", 2);
    SET(gguf_builder_set_u32, "context_length", p->n_ctx);
    SET(gguf_builder_set_u32, "embedding_length", p->n_embd);
    SET(gguf_builder_set_u32, "block_count", p->n_layer);
    SET(gguf_builder_set_u32, "feed_forward_length", p->n_ff);
    SET(gguf_builder_set_u32, "attention.head_count", p->n_head);
    SET(gguf_builder_set_u32, "attention.head_count_kv", p->n_head_kv);
    const uint32_t hd = synth_head_dim(p);
    /* Qwen3 and Gemma 3 files give their head size (and no rotary dimension: it is the head's);
     * the others write the rotary dimension, and the head size only when it is not implied. */
    if ((synth_has(p, NULL) & SYNTH_HAS_HEAD_KEYS) || hd != p->n_embd / p->n_head) {
        SET(gguf_builder_set_u32, "attention.key_length", hd);
        SET(gguf_builder_set_u32, "attention.value_length", hd);
    }
    if (!(synth_has(p, NULL) & SYNTH_HAS_HEAD_KEYS))
        SET(gguf_builder_set_u32, "rope.dimension_count", hd);
    SET(gguf_builder_set_f32, "rope.freq_base", p->rope_base);
    SET(gguf_builder_set_f32, "attention.layer_norm_rms_epsilon", p->rms_eps);
    SET(gguf_builder_set_u32, "vocab_size", p->n_vocab);
    if (p->n_swa > 0) {
        SET(gguf_builder_set_u32, "attention.sliding_window", p->n_swa);
        SET(gguf_builder_set_u32, "attention.sliding_window_pattern", p->swa_pattern);
    }
#undef SET
    return st;
}

corral_status synth_write(const synth_params *p, const char *path, synth_report *rep,
                          corral_error *err) {
    corral_status st = synth_validate(p, err);
    if (st != CORRAL_OK) return st;
    if (!path) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "synth_write: NULL path");
    synth_job job = {.p = p};
    synth_tensor *ts = NULL;
    size_t n_ts = 0;
    gguf_builder *b = gguf_builder_new();
    if (!b) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if ((st = synth_plan(p, &job, &ts, &n_ts, err))) goto done;
    if (synth_set_hparams(b, p) != CORRAL_OK) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    st = p->vocab_from ? synth_vocab_copy(b, p->vocab_from, p->n_vocab, err)
                       : synth_vocab_generated(b, p->n_vocab, err);
    if (st != CORRAL_OK) goto done;

    synth_report r = {.n_tensors = (uint32_t)n_ts};
    job.progress = &p->progress;
    job.n_tensors = n_ts;
    for (size_t i = 0; i < n_ts; i++) {
        synth_tensor *t = &ts[i];
        if (t->ne[0] > job.max_ne0) job.max_ne0 = t->ne[0];
        r.n_params += (uint64_t)(t->ne[0] * t->ne[1]);
        r.tensor_bytes += tensor_row_size(t->type, t->ne[0]) * (uint64_t)t->ne[1];
        uint32_t n_dims = t->ne[1] == 1 ? 1 : 2;
        if ((st = gguf_builder_add_tensor_fill(b, t->name, t->type, n_dims, t->ne, synth_fill, t,
                                               err)))
            goto done;
    }
    job.pool = threadpool_new(p->n_threads, err);
    if (!job.pool) {
        st = err ? err->status : CORRAL_RESOURCE_EXHAUSTED;
        goto done;
    }
    job.scratch =
        malloc((size_t)threadpool_n_threads(job.pool) * (size_t)job.max_ne0 * sizeof *job.scratch);
    if (!job.scratch) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if ((st = gguf_builder_write(b, path, err))) goto done;
    struct stat sb;
    r.file_bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    if (rep) *rep = r;
done:
    threadpool_destroy(&job.pool);
    free(job.scratch);
    free(ts);
    gguf_builder_destroy(&b);
    return st;
}
