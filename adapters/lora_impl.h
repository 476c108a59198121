/*
 * lora_impl.h — the adapter structures behind lora.h's handles (private to adapters/).
 *
 * Every adapter format is brought to one form when it is opened: a list of targets, each a base
 * tensor name with two matrices in the adapter's own storage (borrowed from the mapped file) and
 * a layout saying how they combine into the delta. The merge then only asks for each target's
 * factors in f32 (lora_adapter_factors).
 */
#ifndef CORRAL_ADAPTERS_LORA_IMPL_H
#define CORRAL_ADAPTERS_LORA_IMPL_H

#include <stdint.h>

#include "corral/gguf.h"
#include "lora.h"
#include "safetensors.h"

/* How a target's stored matrices a and b make left (n_out x r) and right (r x n_in). */
typedef enum lora_layout {
    LORA_LAYOUT_LINEAR = 0,    /* a: r x n_in, b: n_out x r (both formats' linear layers) */
    LORA_LAYOUT_GGUF_EMBD = 1, /* a: n_vocab x r, b: n_embd x r (llama.cpp's token_embd) */
    LORA_LAYOUT_PEFT_EMBD = 2, /* a: r x n_vocab, b: n_embd x r (PEFT's lora_embedding_A/B) */
} lora_layout;

/* A row-major matrix inside a mapped file: rows of cols elements of a tensor type. The rows may
 * be unaligned (safetensors does not align its data), so they are copied before conversion. */
typedef struct lora_matrix {
    const uint8_t *data;
    uint32_t type; /* a tensor_type with a to_float kernel */
    int64_t rows, cols;
    size_t row_bytes;
} lora_matrix;

typedef struct lora_target {
    char *name; /* the base tensor */
    uint32_t rank;
    float alpha;
    float scaling;
    int64_t n_in, n_out; /* the base tensor's ne[0], ne[1] */
    lora_matrix a, b;
    lora_layout layout;
    /* Rows of left are permuted from Hugging Face to GGUF order in this many head groups
     * (llama q_proj / k_proj from PEFT); 0: no permutation. */
    uint32_t permute_groups;
} lora_target;

struct lora_adapter {
    lora_format format;
    char *path;
    gguf_file *gguf;      /* LORA_FORMAT_GGUF: the mapped adapter */
    safetensors_file *st; /* LORA_FORMAT_PEFT: the mapped weights */
    lora_target *targets; /* sorted by name */
    uint32_t n_targets;
};

/* The files an adapter path stands for (a GGUF file: itself; a PEFT adapter: its config and its
 * weights), without opening them. Returns how many were written to files (at most 2), or -1 with
 * err set when the path exists as neither. Each files[i] has LORA_PATH_MAX bytes. */
int lora__adapter_files(const char *path, char files[2][LORA_PATH_MAX], lora_format *format,
                        corral_error *err);

#endif /* CORRAL_ADAPTERS_LORA_IMPL_H */
