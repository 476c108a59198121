/*
 * synth.h — synthetic models: GGUF files with the exact shapes of real models and random weights.
 *
 * Benchmarks need models of real sizes (TinyLlama-1.1B, SmolLM2-135M, Qwen2-0.5B) in every weight
 * type, and tests need small models of any shape; neither needs trained weights. A synthetic model
 * has the tensors, shapes, metadata keys, tensor-type mix and vocabulary size of the real one, so
 * it costs the engine exactly what the real one would, and it loads and generates like any model.
 *
 * Weights are deterministic: a tensor's rows are drawn from a PRNG seeded by (seed, tensor name,
 * row), so the same parameters always give a byte-identical file, whatever the thread count.
 * 2-D weights are roughly normal with standard deviation 0.02 (the usual initializer range),
 * biases likewise, and norm weights are 1 ± 0.1, so a forward pass gives finite logits that differ
 * across the vocabulary. Quantized types are made by the engine's reference quantizers
 * (tensor_type_get_traits(type)->from_float).
 *
 * Tensor types follow llama.cpp's `llama-quantize` (src/llama-quant.cpp, llama_tensor_get_type):
 *   - 1-D tensors (norms, biases) are F32.
 *   - Unless `pure` is set and for quantized types only: output.weight — or token_embd.weight when
 *     the embeddings are tied, since it is then the output projection too — is Q6_K (Q8_0 stays
 *     Q8_0; Q8_0 when the row length is not a multiple of the type's block); Q4_K_M and Q5_K_M put
 *     attn_v and ffn_down in Q6_K in the "use_more_bits" layers (i < n/8, i >= 7n/8, or
 *     (i - n/8) % 3 == 2); Q4_K_S (type q4_k) puts attn_v of layers 0..3 and ffn_down of layers
 *     i < n/8 in Q5_K. An untied token_embd.weight keeps the base type, as llama.cpp's does.
 *   - A row length that is not a multiple of the chosen type's block falls back as llama.cpp does:
 *     Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16 when even that does not fit (or for a
 *     32-element type that does not fit).
 * `general.file_type` is llama.cpp's ftype of the mix (q4_k is MOSTLY_Q4_K_S, q5_k MOSTLY_Q5_K_S).
 *
 * The file is written tensor by tensor (gguf_builder_add_tensor_fill): memory use is about the
 * largest tensor, not the model. Rows are generated in parallel on a thread pool.
 */
#ifndef CORRAL_SYNTH_H
#define CORRAL_SYNTH_H

#include <stdint.h>

#include "corral/progress.h"
#include "corral/status.h"

/* The weight types `corral synth --type` accepts. Append only. */
typedef enum synth_type {
    SYNTH_TYPE_F32 = 0,
    SYNTH_TYPE_F16 = 1,
    SYNTH_TYPE_BF16 = 2,
    SYNTH_TYPE_Q8_0 = 3,
    SYNTH_TYPE_Q4_0 = 4,
    SYNTH_TYPE_Q4_1 = 5,
    SYNTH_TYPE_Q5_0 = 6,
    SYNTH_TYPE_Q5_1 = 7,
    SYNTH_TYPE_Q4_K = 8,
    SYNTH_TYPE_Q5_K = 9,
    SYNTH_TYPE_Q6_K = 10,
    SYNTH_TYPE_Q4_K_M = 11,
    SYNTH_TYPE_Q5_K_M = 12,
    SYNTH_TYPE_COUNT
} synth_type;

/* Everything that determines a synthetic model file. */
typedef struct synth_params {
    /* "llama", "qwen2" (Q/K/V biases), "qwen3" (per-head q/k norms), "gemma3" (q/k norms, post
     * norms, sliding window) or "phi3" (fused attn_qkv and gate+up ffn_up): the tensors and keys
     * of that architecture as llama.cpp's converter writes them. */
    char arch[16];
    uint32_t n_embd;    /* embedding width; a multiple of n_head unless head_dim is set */
    uint32_t n_layer;   /* transformer blocks */
    uint32_t n_head;    /* query heads; a multiple of n_head_kv */
    uint32_t n_head_kv; /* key/value heads */
    uint32_t n_ff;      /* feed-forward width */
    uint32_t n_vocab;   /* rows of token_embd (the vocabulary is padded up to it) */
    uint32_t n_ctx;     /* <arch>.context_length */
    float rope_base;    /* <arch>.rope.freq_base */
    float rms_eps;      /* <arch>.attention.layer_norm_rms_epsilon */
    int tied;           /* 1: no output.weight, the output projection is token_embd */
    /* <arch>.attention.key_length and value_length: the head size when it is not n_embd / n_head
     * (Qwen3, Gemma 3); 0: n_embd / n_head. */
    uint32_t head_dim;
    /* gemma3: <arch>.attention.sliding_window (0: no window) and sliding_window_pattern. */
    uint32_t n_swa;
    uint32_t swa_pattern;
    /* llama: rope_freqs.weight by Llama 3's rule (factor, low and high frequency factors 1 and 4,
     * the original context rope_orig_ctx); 0: no rope_freqs. */
    float rope_llama3_factor;
    uint32_t rope_orig_ctx;
    synth_type type; /* weight type or mix */
    int pure;        /* 1: every 2-D weight in the base type (llama-quantize --pure) */
    uint64_t seed;
    /* A GGUF file whose tokenizer.* keys are copied; NULL for a generated SPM vocabulary of
     * n_vocab tokens (<unk>, <s>, </s>, the 256 byte tokens, then filler pieces). Borrowed. */
    const char *vocab_from;
    char name[128];     /* general.name; "" for one made from the shape, type and seed */
    uint32_t n_threads; /* threads generating rows; 0 = the physical cores. No effect on bytes. */
    /* Told as the file is written: done/total in tensors, from synth_write's thread. Optional. */
    corral_progress progress;
} synth_params;

/* What synth_write produced. */
typedef struct synth_report {
    uint32_t n_tensors;
    uint64_t n_params;     /* elements over all tensors */
    uint64_t tensor_bytes; /* bytes of tensor data */
    uint64_t file_bytes;   /* size of the written file */
} synth_report;

/* A small llama model (n_embd 256, 2 layers, 4 heads, 2 KV heads, n_ff 768, n_vocab 512, ctx 512,
 * separate output), F32, seed 1, generated vocabulary, threads 0. */
synth_params synth_params_default(void);

/* Set the shape fields of *p (arch, dims, head_dim, n_vocab, n_ctx, rope_base, rms_eps, tied,
 * the sliding window and Llama 3 RoPE scaling) to those of a named real model; other fields are
 * left alone. Presets: "tinyllama-1.1b", "smollm2-135m", "qwen2-0.5b", "qwen3-0.6b",
 * "gemma3-1b", "llama3.2-1b", "phi3-mini". CORRAL_NOT_FOUND with a message naming the preset and
 * listing the known ones. */
corral_status synth_params_set_preset(synth_params *p, const char *preset, corral_error *err);

/* "tinyllama-1.1b, smollm2-135m, ...". Static. */
const char *synth_preset_names(void);

/* "llama, qwen2, qwen3, gemma3, phi3": the architectures synth writes. Static. */
const char *synth_arch_names(void);

/* Parse a type name ("q4_k_m", case-insensitive). CORRAL_NOT_FOUND with a message naming it and
 * listing the known ones. */
corral_status synth_type_parse(const char *name, synth_type *out, corral_error *err);

/* "q4_k_m"; "?" for values outside the enum. Static. */
const char *synth_type_name(synth_type type);

/* Check the parameters: known arch and type, sizes in the loader's ranges, n_embd divisible by
 * n_head (without head_dim), n_head a multiple of n_head_kv, an even head dimension, n_vocab >=
 * 259 for a generated vocabulary, a sliding window only for gemma3 and Llama 3 RoPE only for
 * llama. CORRAL_INVALID_ARGUMENT with a message naming the offending value(s). */
corral_status synth_validate(const synth_params *p, corral_error *err);

/* The tensor type synth_write stores `tensor` (a GGUF tensor name such as "blk.3.attn_v.weight"
 * or "output.weight") in for parameters p; the row length is taken from p's shape.
 * Returns a tensor_type id, or -1 for a name the model does not have. */
int32_t synth_tensor_type(const synth_params *p, const char *tensor);

/* Validate p and write the model to path (atomically: a temporary file renamed over path). With
 * vocab_from, that file's tokenizer.* keys are copied, and its token list padded with unused
 * "[PAD<i>]" tokens up to n_vocab (an error when it has more than n_vocab tokens). rep may be
 * NULL. Errors: CORRAL_INVALID_ARGUMENT for bad parameters, the gguf_open errors for vocab_from,
 * CORRAL_IO and CORRAL_OUT_OF_MEMORY; messages name the file. Thread-safe for different paths. */
corral_status synth_write(const synth_params *p, const char *path, synth_report *rep,
                          corral_error *err);

#endif /* CORRAL_SYNTH_H */
