/*
 * arch.c — the architecture table.
 *
 * llama and qwen2 share one decoder (forward_decoder in forward.c): pre-norm RMSNorm, attention
 * with rotary embeddings and grouped-query heads, SwiGLU feed-forward, final RMSNorm, output
 * projection (tied to the embeddings when output.weight is absent). qwen2 differs by Q/K/V biases
 * and NEOX-style rotation; llama GGUF files store Q and K rows permuted so that adjacent pairs
 * rotate (NORM style).
 */
#include "arch.h"

#include <string.h>

#include "model_impl.h"

#define LAYER(role, name, ne0, ne1, flags) \
    { role, "blk.%u." name, {ne0, ne1}, flags }

/* The tensors of the llama-style decoder; biases only where the architecture has them. */
#define DECODER_COMMON_TENSORS                                                         \
    {ARCH_ROLE_TOKEN_EMBD, "token_embd.weight", {ARCH_DIM_EMBD, ARCH_DIM_VOCAB}, 0},   \
        {ARCH_ROLE_OUTPUT_NORM,                                                        \
         "output_norm.weight",                                                         \
         {ARCH_DIM_EMBD, ARCH_DIM_NONE},                                               \
         ARCH_TENSOR_F32},                                                             \
        {ARCH_ROLE_OUTPUT,                                                             \
         "output.weight",                                                              \
         {ARCH_DIM_EMBD, ARCH_DIM_VOCAB},                                              \
         ARCH_TENSOR_OPTIONAL},                                                        \
        {ARCH_ROLE_ROPE_FREQS,                                                         \
         "rope_freqs.weight",                                                          \
         {ARCH_DIM_ROT_HALF, ARCH_DIM_NONE},                                           \
         ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_F32},                                      \
        LAYER(ARCH_ROLE_ATTN_NORM, "attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,   \
              ARCH_TENSOR_F32),                                                        \
        LAYER(ARCH_ROLE_ATTN_Q, "attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q, 0),        \
        LAYER(ARCH_ROLE_ATTN_K, "attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, 0),       \
        LAYER(ARCH_ROLE_ATTN_V, "attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, 0),       \
        LAYER(ARCH_ROLE_ATTN_OUT, "attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, 0), \
        LAYER(ARCH_ROLE_FFN_NORM, "ffn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE,     \
              ARCH_TENSOR_F32),                                                        \
        LAYER(ARCH_ROLE_FFN_GATE, "ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, 0),   \
        LAYER(ARCH_ROLE_FFN_UP, "ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, 0),       \
        LAYER(ARCH_ROLE_FFN_DOWN, "ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, 0)

static const arch_tensor llama_tensors[] = {
    DECODER_COMMON_TENSORS,
    /* Some llama-architecture exports carry attention biases; use them when present. */
    LAYER(ARCH_ROLE_ATTN_Q_BIAS, "attn_q.bias", ARCH_DIM_Q, ARCH_DIM_NONE,
          ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_F32),
    LAYER(ARCH_ROLE_ATTN_K_BIAS, "attn_k.bias", ARCH_DIM_KV, ARCH_DIM_NONE,
          ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_F32),
    LAYER(ARCH_ROLE_ATTN_V_BIAS, "attn_v.bias", ARCH_DIM_KV, ARCH_DIM_NONE,
          ARCH_TENSOR_OPTIONAL | ARCH_TENSOR_F32),
};

static const arch_tensor qwen2_tensors[] = {
    DECODER_COMMON_TENSORS,
    LAYER(ARCH_ROLE_ATTN_Q_BIAS, "attn_q.bias", ARCH_DIM_Q, ARCH_DIM_NONE, ARCH_TENSOR_F32),
    LAYER(ARCH_ROLE_ATTN_K_BIAS, "attn_k.bias", ARCH_DIM_KV, ARCH_DIM_NONE, ARCH_TENSOR_F32),
    LAYER(ARCH_ROLE_ATTN_V_BIAS, "attn_v.bias", ARCH_DIM_KV, ARCH_DIM_NONE, ARCH_TENSOR_F32),
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
};

const arch_desc *arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < N_OF(arch_table); i++)
        if (strlen(arch_table[i].name) == len && memcmp(arch_table[i].name, name, len) == 0)
            return &arch_table[i];
    return NULL;
}

const char *arch_supported_names(void) {
    return "llama, qwen2";
}
