/*
 * arch.h — model architectures as data (private to the engine).
 *
 * An architecture is a row of arch_table: its GGUF name, its rotary style, the tensors it needs
 * (name pattern, expected shape in terms of the hyperparameters, whether optional or per layer)
 * and the forward function that runs it. Adding an architecture that reuses the llama-style
 * decoder (e.g. one with biases or a different RoPE) is a new row; one with new operations
 * (fused QKV, other norms) adds those operations and a forward function.
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
    ARCH_ROLE_FFN_NORM,
    ARCH_ROLE_FFN_GATE,
    ARCH_ROLE_FFN_UP,
    ARCH_ROLE_FFN_DOWN,
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
} arch_dim;

enum {
    ARCH_TENSOR_OPTIONAL = 1u << 0, /* may be absent */
    ARCH_TENSOR_F32 = 1u << 1,      /* must be stored as F32 (norms, biases, rope factors) */
};

typedef struct arch_tensor {
    arch_role role;
    const char *name; /* GGUF tensor name; per-layer roles contain one %u for the block index */
    arch_dim ne[2];   /* expected ne[0], ne[1] */
    uint32_t flags;
} arch_tensor;

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
} arch_desc;

/* The row for a general.architecture value, or NULL. */
const arch_desc *arch_find(const char *name, size_t len);

/* The supported names, comma-separated, for error messages. */
const char *arch_supported_names(void);

#endif /* CORRAL_ENGINE_ARCH_H */
