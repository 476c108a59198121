/*
 * arch.h — model architectures as data (private to the engine).
 *
 * An architecture is a row of arch_table: its GGUF name, its rotary style, the tensors it needs
 * (name pattern, expected shape in terms of the hyperparameters, whether optional or per layer),
 * the features of the shared decoder it switches on (the feed-forward activation, scaled
 * embeddings, sliding-window attention) and the forward function that runs it. Everything in
 * which two architectures differ is in their rows: an optional operation of the decoder (per-head
 * q/k norms, norms after attention and feed-forward, biases) runs when its tensor is bound, and a
 * fused tensor (phi3's attn_qkv, its gate+up ffn_up) is bound as views of its rows, one per role,
 * so the decoder never knows it was fused. A new row that needs no new operation is all a new
 * architecture costs.
 */
#ifndef CORRAL_ENGINE_ARCH_H
#define CORRAL_ENGINE_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

/* The role of each weight the forward passes use. Global roles first, then per-layer ones. */
typedef enum arch_role {
    ARCH_ROLE_TOKEN_EMBD = 0,
    ARCH_ROLE_OUTPUT_NORM,
    ARCH_ROLE_OUTPUT,
    ARCH_ROLE_ROPE_FREQS,
    ARCH_ROLE_FIRST_LAYER_ROLE,
    ARCH_ROLE_ATTN_NORM = ARCH_ROLE_FIRST_LAYER_ROLE,
    ARCH_ROLE_ATTN_Q,
    ARCH_ROLE_ATTN_K,
    ARCH_ROLE_ATTN_V,
    ARCH_ROLE_ATTN_OUT,
    ARCH_ROLE_ATTN_Q_BIAS,
    ARCH_ROLE_ATTN_K_BIAS,
    ARCH_ROLE_ATTN_V_BIAS,
    ARCH_ROLE_ATTN_Q_NORM,    /* [head_dim]: RMSNorm of each query head before RoPE (qwen3) */
    ARCH_ROLE_ATTN_K_NORM,    /* [head_dim]: the same for each key head */
    ARCH_ROLE_ATTN_POST_NORM, /* [n_embd]: RMSNorm of the attention output (gemma3) */
    ARCH_ROLE_FFN_NORM,
    ARCH_ROLE_FFN_GATE,
    ARCH_ROLE_FFN_UP,
    ARCH_ROLE_FFN_DOWN,
    ARCH_ROLE_FFN_POST_NORM, /* [n_embd]: RMSNorm of the feed-forward output (gemma3) */
    ARCH_ROLE_COUNT
} arch_role;

#define ARCH_N_GLOBAL_ROLES ((int)ARCH_ROLE_FIRST_LAYER_ROLE)
#define ARCH_N_LAYER_ROLES  ((int)ARCH_ROLE_COUNT - (int)ARCH_ROLE_FIRST_LAYER_ROLE)

/* Symbolic sizes a tensor dimension is checked against. */
typedef enum arch_dim {
    ARCH_DIM_NONE = 0, /* the dimension does not exist (1-D tensor) */
    ARCH_DIM_EMBD,     /* n_embd */
    ARCH_DIM_VOCAB,    /* n_vocab (taken from token_embd) */
    ARCH_DIM_Q,        /* n_head * head_dim */
    ARCH_DIM_KV,       /* n_head_kv * head_dim */
    ARCH_DIM_FF,       /* n_ff */
    ARCH_DIM_ROT_HALF, /* n_rot / 2 */
    ARCH_DIM_HEAD,     /* head_dim (key_length) */
    ARCH_DIM_QKV,      /* n_q + 2 * n_kv: a fused Q, K and V */
    ARCH_DIM_FF2,      /* 2 * n_ff: a fused gate and up */
} arch_dim;

enum {
    ARCH_TENSOR_OPTIONAL = 1u << 0, /* may be absent */
    ARCH_TENSOR_F32 = 1u << 1,      /* must be stored as F32 (norms, biases, rope factors) */
    /* A tensor whose presence means a feature corral does not implement: loading fails with a
     * message naming it (`what`), rather than computing something else. */
    ARCH_TENSOR_REJECT = 1u << 2,
};

/* The most weights one fused tensor holds (Q, K and V). */
#define ARCH_MAX_PARTS 3

typedef struct arch_tensor {
    arch_role role;   /* the role it binds (a fused tensor: unused, see parts) */
    const char *name; /* GGUF tensor name; per-layer roles contain one %u for the block index */
    arch_dim ne[2];   /* expected ne[0], ne[1] */
    uint32_t flags;
    /* A fused tensor: its rows are the weights of parts[0], parts[1], ... one after the other,
     * part_rows[i] rows each; each part is bound as a view of its rows (never copied). n_parts 0:
     * an ordinary tensor. */
    uint32_t n_parts;
    arch_role parts[ARCH_MAX_PARTS];
    arch_dim part_rows[ARCH_MAX_PARTS];
    const char *what; /* ARCH_TENSOR_REJECT: the feature it stands for */
} arch_tensor;

/* The activation of the gated feed-forward: ffn_down(act(gate) * up). */
typedef enum arch_ffn_act {
    ARCH_FFN_SILU = 0,      /* SwiGLU: llama, qwen, phi3 */
    ARCH_FFN_GELU_TANH = 1, /* GeGLU with the tanh approximation of GELU: gemma */
} arch_ffn_act;

struct model;
struct model_runner;
struct kv_cache;

/* One pass of a batch: n_tok tokens (at most the runner's max_batch, already checked), each with
 * its sequence's cache and its position there. The tokens of one sequence are consecutive, in
 * order, at consecutive positions starting at its cache's n_pos. */
typedef struct forward_batch {
    uint32_t n_tok;
    const int32_t *tokens;      /* [n_tok] ids */
    struct kv_cache *const *kv; /* [n_tok] the cache of each token's sequence */
    const uint32_t *pos;        /* [n_tok] each token's position in its cache */
} forward_batch;

/* Run a batch through the network: every token's keys and values go into its cache at its
 * position, every cache ends holding its sequence's tokens (n_pos is one past its last token's
 * position), and the final hidden states (before the output norm) are left in the runner's
 * residual buffer, row t for token t. */
typedef void (*arch_forward_fn)(struct model_runner *r, const forward_batch *b);

typedef struct arch_desc {
    const char *name;
    rope_style rope;
    const arch_tensor *tensors;
    size_t n_tensors;
    arch_forward_fn forward;
    arch_ffn_act ffn_act;
    /* The embeddings are multiplied by sqrt(n_embd) before the first layer (gemma). */
    int embd_scale_sqrt;
    /* Sliding-window attention as gemma3 has it: <arch>.attention.sliding_window keys a window
     * of that many positions (0 or absent: none) on the layers of
     * <arch>.attention.sliding_window_pattern (default swa_pattern_default; layer il slides iff
     * pattern is 0 or il % pattern < pattern - 1, as llama.cpp), whose RoPE has its own base
     * <arch>.rope.freq_base_swa (default rope_base_swa_default) and no scaling. Architectures
     * without it ignore the keys (llama.cpp ignores phi3's). */
    int swa;
    uint32_t swa_pattern_default;
    float rope_base_swa_default;
    /* <arch>.final_logit_softcapping is read: logits become c * tanh(logit / c). */
    int softcap;
} arch_desc;

/* The row for a general.architecture value, or NULL. */
const arch_desc *arch_find(const char *name, size_t len);

/* The supported names, comma-separated, for error messages. */
const char *arch_supported_names(void);

#endif /* CORRAL_ENGINE_ARCH_H */
