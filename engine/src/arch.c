/*
 * arch.c — the architecture table.
 *
 * Every architecture runs on one decoder (forward_decoder in forward.c): pre-norm RMSNorm,
 * attention with rotary embeddings and grouped-query heads, a gated feed-forward, final RMSNorm,
 * output projection (tied to the embeddings when output.weight is absent). The rows below say how
 * each family departs from that plain llama block, and this is the one place that says it:
 *
 *   llama   RoPE on adjacent pairs (GGUF stores Q and K rows permuted for it: NORM style);
 *           optional Q/K/V biases; rope_freqs.weight divides the angles (Llama 3.1/3.2 scaling,
 *           forward.c's rotation reads it through rope_params.freq_factors).
 *   qwen2   Q/K/V biases, NEOX RoPE (pairs i, i + n_rot/2).
 *   qwen3   no biases; each query and key head RMS-normalised (attn_q_norm / attn_k_norm, one
 *           [head_dim] weight for all heads) before NEOX RoPE; head size from key_length.
 *   gemma3  embeddings times sqrt(n_embd); per-head q/k norms; the attention output and the
 *           feed-forward output each RMS-normalised (post_attention_norm, post_ffw_norm) before
 *           they join the residual; GELU-tanh gated feed-forward; sliding-window attention on the
 *           local layers with their own RoPE base; logit softcapping when the file asks.
 *   phi3    Q, K and V fused in attn_qkv and gate and up fused in ffn_up: bound as views of the
 *           fused tensor's rows. NEOX RoPE. LongRoPE factor tensors (the 128k variants) are
 *           refused by name.
 */
#include "arch.h"

#include <string.h>

#include "model_impl.h"

#define LAYER(r, n, d0, d1, f) \
    { .role = r, .name = "blk.%u." n, .ne = {d0, d1}, .flags = f }
#define GLOBAL(r, n, d0, d1, f) \
    { .role = r, .name = n, .ne = {d0, d1}, .flags = f }

/* The parts of the llama-style decoder every architecture has. */
#define EMBD_AND_HEAD                                                                     \
    GLOBAL(ARCH_ROLE_TOKEN_EMBD, "token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, 0),  \
        GLOBAL(ARCH_ROLE_OUTPUT_NORM, "output_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, \
               ARCH_TENSOR_F32),                                                          \
        GLOBAL(ARCH_ROLE_OUTPUT, "output.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB,          \
               ARCH_TENSOR_OPTIONAL),                                                     \
        LAYER(ARCH_ROLE_ATTN_NORM, "attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,      \
              ARCH_TENSOR_F32),                                                           \
        LAYER(ARCH_ROLE_ATTN_OUT, "attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, 0),    \
        LAYER(ARCH_ROLE_FFN_NORM, "ffn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,        \
              ARCH_TENSOR_F32),                                                           \
        LAYER(ARCH_ROLE_FFN_DOWN, "ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, 0)

#define SEPARATE_QKV                                                             \
    LAYER(ARCH_ROLE_ATTN_Q, "attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q, 0),      \
        LAYER(ARCH_ROLE_ATTN_K, "attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, 0), \
        LAYER(ARCH_ROLE_ATTN_V, "attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, 0)

#define SEPARATE_GATE_UP                                                         \
    LAYER(ARCH_ROLE_FFN_GATE, "ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, 0), \
        LAYER(ARCH_ROLE_FFN_UP, "ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, 0)

#define ROPE_FREQS                                                                      \
    GLOBAL(ARCH_ROLE_ROPE_FREQS, "rope_freqs.weight", ARCH_DIM_ROT_HALF, ARCH_DIM_NONE, \
           ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_F32)

#define QK_NORMS                                                                         \
    LAYER(ARCH_ROLE_ATTN_Q_NORM, "attn_q_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE,     \
          ARCH_TENSOR_F32),                                                              \
        LAYER(ARCH_ROLE_ATTN_K_NORM, "attn_k_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, \
              ARCH_TENSOR_F32)

#define QKV_BIASES(flags)                                                       \
    LAYER(ARCH_ROLE_ATTN_Q_BIAS, "attn_q.bias", ARCH_DIM_Q, ARCH_DIM_NONE,      \
          ARCH_TENSOR_F32 | (flags)),                                           \
        LAYER(ARCH_ROLE_ATTN_K_BIAS, "attn_k.bias", ARCH_DIM_KV, ARCH_DIM_NONE, \
              ARCH_TENSOR_F32 | (flags)),                                       \
        LAYER(ARCH_ROLE_ATTN_V_BIAS, "attn_v.bias", ARCH_DIM_KV, ARCH_DIM_NONE, \
              ARCH_TENSOR_F32 | (flags))

static const arch_tensor llama_tensors[] = {
    EMBD_AND_HEAD,
    SEPARATE_QKV,
    SEPARATE_GATE_UP,
    ROPE_FREQS,
    /* Some llama-architecture exports carry attention biases; use them when present. */
    QKV_BIASES(ARCH_TENSOR_OPTIONAL),
};

static const arch_tensor qwen2_tensors[] = {
    EMBD_AND_HEAD, SEPARATE_QKV, SEPARATE_GATE_UP, ROPE_FREQS, QKV_BIASES(0),
};

static const arch_tensor qwen3_tensors[] = {
    EMBD_AND_HEAD, SEPARATE_QKV, SEPARATE_GATE_UP, ROPE_FREQS, QK_NORMS,
};

static const arch_tensor gemma3_tensors[] = {
    EMBD_AND_HEAD,
    SEPARATE_QKV,
    SEPARATE_GATE_UP,
    QK_NORMS,
    LAYER(ARCH_ROLE_ATTN_POST_NORM, "post_attention_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,
          ARCH_TENSOR_F32),
    LAYER(ARCH_ROLE_FFN_POST_NORM, "post_ffw_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,
          ARCH_TENSOR_F32),
};

static const arch_tensor phi3_tensors[] = {
    EMBD_AND_HEAD,
    {.name = "blk.%u.attn_qkv.weight",
     .ne = {ARCH_DIM_EMBD, ARCH_DIM_QKV},
     .n_parts = 3,
     .parts = {ARCH_ROLE_ATTN_Q, ARCH_ROLE_ATTN_K, ARCH_ROLE_ATTN_V},
     .part_rows = {ARCH_DIM_Q, ARCH_DIM_KV, ARCH_DIM_KV}},
    {.name = "blk.%u.ffn_up.weight",
     .ne = {ARCH_DIM_EMBD, ARCH_DIM_FF2},
     .n_parts = 2,
     .parts = {ARCH_ROLE_FFN_GATE, ARCH_ROLE_FFN_UP},
     .part_rows = {ARCH_DIM_FF, ARCH_DIM_FF}},
    {.name = "rope_factors_long.weight",
     .ne = {ARCH_DIM_ROT_HALF, ARCH_DIM_NONE},
     .flags = ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_REJECT,
     .what = "LongRoPE scaling (the 128k-context phi3 variants)"},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const arch_desc arch_table[] = {
    {.name = "llama",
     .rope = ROPE_STYLE_NORM,
     .tensors = llama_tensors,
     .n_tensors = N_OF(llama_tensors),
     .forward = forward_decoder},
    {.name = "qwen2",
     .rope = ROPE_STYLE_NEOX,
     .tensors = qwen2_tensors,
     .n_tensors = N_OF(qwen2_tensors),
     .forward = forward_decoder},
    {.name = "qwen3",
     .rope = ROPE_STYLE_NEOX,
     .tensors = qwen3_tensors,
     .n_tensors = N_OF(qwen3_tensors),
     .forward = forward_decoder},
    {.name = "gemma3",
     .rope = ROPE_STYLE_NEOX,
     .tensors = gemma3_tensors,
     .n_tensors = N_OF(gemma3_tensors),
     .forward = forward_decoder,
     .ffn_act = ARCH_FFN_GELU_TANH,
     .embd_scale_sqrt = 1,
     .swa = 1,
     .swa_pattern_default = 6,
     .rope_base_swa_default = 10000.0f,
     .softcap = 1},
    {.name = "phi3",
     .rope = ROPE_STYLE_NEOX,
     .tensors = phi3_tensors,
     .n_tensors = N_OF(phi3_tensors),
     .forward = forward_decoder},
};

const arch_desc *arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < N_OF(arch_table); i++)
        if (strlen(arch_table[i].name) == len && memcmp(arch_table[i].name, name, len) == 0)
            return &arch_table[i];
    return NULL;
}

const char *arch_supported_names(void) {
    return "llama, qwen2, qwen3, gemma3, phi3";
}
