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

/* One adapter's term in the merge of one tensor: factor · left · right in f32, left n_out x rank
 * and right rank x n_in (lora_adapter_factors), factor = the user's scale x the scaling. */
typedef struct lora_term {
    float *left;
    float *right;
    uint32_t rank;
    float factor;
} lora_term;

/* The terms of every adapter of list[0..n) that targets base tensor w (named name), in list
 * order: *out (free with lora__terms_free), *n_terms of them (0: no adapter targets it), the
 * largest rank in *max_rank. Errors: CORRAL_INVALID_ARGUMENT for an adapter opened against
 * another base, CORRAL_OUT_OF_MEMORY, lora_adapter_factors'. */
corral_status lora__terms_load(const gguf_tensor *w, const char *name, const lora_apply *list,
                               uint32_t n, lora_term **out, uint32_t *n_terms, uint32_t *max_rank,
                               corral_error *err);
void lora__terms_free(lora_term *terms, uint32_t n);

/* 1 when some term changes row o (a coefficient factor · left[o][k] is not zero). */
int lora__row_changed(const lora_term *terms, uint32_t n_terms, int64_t o);

/* row (n_in floats, row o of the tensor) += every term's row o, terms in order, each as
 * sum_k coef[k] · right[k] with coef[k] = factor · left[o][k] (coef: max rank floats of
 * scratch). The same arithmetic in the same order whatever the caller, so a merged row is the
 * same bits in lora_merge_tensor and in a merge that quantizes (lora_quant.c). */
void lora__add_terms(float *row, int64_t o, const lora_term *terms, uint32_t n_terms, int64_t n_in,
                     float *coef);

/* The fingerprint of base_path with adapters src[0..n) (min_adapters..LORA_MAX_ADAPTERS of them)
 * in the given domain, plus `extra` when it is not negative (a quantized variant's file type).
 * lora_fingerprint is the merged-model case. Errors as lora_fingerprint's. */
corral_status lora__fingerprint(const char *domain, const char *base_path, const lora_source *src,
                                uint32_t n, uint32_t min_adapters, int64_t extra,
                                char out[IMAGE_FINGERPRINT_CHARS + 1], corral_error *err);

/* A quantized variant (lora_quant.c): its fingerprint, and its build into an image of kind
 * LORA_QUANT_IMAGE_KIND at out_path (merging src[0..n) in f32 first when n > 0), logging a line
 * every tenth of its tensors when log_progress and telling `progress` (may be NULL) each tensor
 * written (done/total: tensors). */
corral_status lora__quant_fingerprint(const char *base_path, const lora_source *src, uint32_t n,
                                      const char *type, char out[IMAGE_FINGERPRINT_CHARS + 1],
                                      corral_error *err);
corral_status lora__quant_build(const char *base_path, const lora_source *src, uint32_t n,
                                const char *type, const char *fingerprint, const char *out_path,
                                threadpool *pool, const atomic_int *cancel, int log_progress,
                                const corral_progress *progress, lora_merge_report *rep,
                                corral_error *err);

/* Count one merged (or quantized) model made (lora_merge_count). */
void lora__count_merge(void);

#endif /* CORRAL_ADAPTERS_LORA_IMPL_H */
