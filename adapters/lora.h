/*
 * lora.h — LoRA adapters merged into a base model's weights, and the cache of merged models.
 *
 * An adapter specialises a base model with low-rank corrections: for each targeted weight W
 * (n_out x n_in) it carries A (r x n_in) and B (n_out x r), and the adapted model computes
 * W·x + s·(alpha/r)·B·(A·x). corral does not run adapters at inference time: it merges them once,
 *     W' = W + sum_i s_i · (alpha_i / r_i) · B_i · A_i,
 * computed in f32 one row at a time (dequantize the row, add every adapter's low-rank term,
 * quantize the row back to the base tensor's own type with the engine's reference quantizer), so
 * that an adapted model is an ordinary model file and runs exactly as fast as its base. A row
 * that no adapter changes keeps its original bytes.
 *
 * Adapter formats (lora_adapter_open tells them apart):
 *   - llama.cpp GGUF LoRA: general.type = "adapter", adapter.type = "lora", adapter.lora.alpha
 *     (f32; 0 or absent means "no alpha/r factor", as llama.cpp reads it), general.architecture
 *     equal to the base's; tensors "<base tensor>.lora_a" (ne = [n_in, r], i.e. rows of n_in) and
 *     "<base tensor>.lora_b" (ne = [r, n_out]), any type the engine can dequantize (F32, F16, BF16,
 *     Q8_0, ...). token_embd.weight is the exception llama.cpp makes: lora_a is (n_vocab x r) and
 *     lora_b (n_embd x r), delta[v][e] = sum_k a[v][k]·b[e][k]. "*_norm.weight" tensors, which
 *     llama.cpp ignores, are ignored with a warning; any other suffix is an error.
 *   - Hugging Face PEFT: a directory with adapter_config.json and adapter_model.safetensors (the
 *     path may name the directory or either file). Tensor names
 *     "base_model.model.<module>.lora_A.weight" / ".lora_B.weight" (embeddings:
 *     ".lora_embedding_A" (r x n_vocab) / ".lora_embedding_B" (n_embd x r)), dtypes F32, F16,
 *     BF16. Modules are mapped onto GGUF tensor names for the llama, qwen2, qwen3, gemma3 and
 *     phi3 architectures:
 *         model.layers.N.self_attn.{q,k,v,o}_proj -> blk.N.attn_{q,k,v,output}.weight
 *         model.layers.N.mlp.{gate,up,down}_proj  -> blk.N.ffn_{gate,up,down}.weight
 *         model.layers.N.self_attn.qkv_proj       -> blk.N.attn_qkv.weight (phi3, fused)
 *         model.layers.N.mlp.gate_up_proj         -> blk.N.ffn_up.weight (phi3, fused)
 *         model.embed_tokens -> token_embd.weight,  lm_head -> output.weight
 *     llama GGUF files store the rows of Q and K permuted for their RoPE (per head, the two halves
 *     interleaved: GGUF row h·d + 2i + j is Hugging Face row h·d + j·d/2 + i), so lora_B of q_proj
 *     (n_head groups) and k_proj (n_head_kv groups) is permuted the same way; lora_A is unchanged;
 *     the other architectures' files are not permuted. Scaling: lora_alpha / r, or lora_alpha /
 * sqrt(r) with use_rslora; rank_pattern and alpha_pattern override r and lora_alpha per module,
 * their keys matched as PEFT does (the key as a regular expression matching the whole module name
 * or a suffix of it after a '.'; a subset of regular expressions: literals, '.', escapes, classes,
 *     '*', '+', '?', '^', '$'). Variants whose effect is not a plain low-rank delta on the original
 *     base are rejected by name: DoRA (use_dora), peft_type other than LORA, trained biases (bias
 *     != "none", lora_bias), modules_to_save, fan_in_fan_out, aLoRA, QALoRA, layer_replication,
 *     target_parameters, and initialisations that rewrite the base weights (PiSSA, OLoRA, CorDA,
 *     LoftQ). When base_model_name_or_path names a directory with a Hugging Face config.json
 *     (beside the adapter directory or inside it), its model_type must match the base's
 *     architecture.
 *
 * Checks before any work: an adapter is opened against the base it will be merged into, and every
 * target is checked then: the base has the tensor, 2-D, of a type corral can re-quantize; A and B
 * both present, 2-D, with equal rank (and, for PEFT, the rank the config gives the module); their
 * outer dimensions equal the base tensor's. Errors name the adapter, the tensor and what is
 * wrong: CORRAL_FORMAT for a malformed adapter (missing lora_b, rank mismatch between A and B, a
 * corrupt safetensors header, bad config values), CORRAL_INVALID_ARGUMENT for an adapter that does
 * not fit this base (wrong architecture, shape mismatch, a tensor the base does not have),
 * CORRAL_UNSUPPORTED for variants and names corral refuses, CORRAL_NOT_FOUND / CORRAL_IO for the
 * file system. Nothing is ever written to the base model.
 *
 * Merged models are corral images (corral/image.h) of kind "merged-model": the base's metadata
 * and tensors with the targeted tensors replaced, plus corral.lora.base (the base's absolute path)
 * and corral.lora.adapters (one "path:scale" string per adapter). model_load reads them as
 * any model. Their fingerprint covers the base file, every adapter file and every scale (see
 * image.h: path, size, mtime and the ends of each file), and the merge algorithm's version.
 *
 * The cache (lora_variant_prepare): a directory of merged images named "lora-<fingerprint>.gguf".
 * A request whose image exists and verifies maps it and does no merge work; a missing, stale or
 * corrupt one is (re)built atomically. After a build the directory is trimmed to a size limit,
 * least recently used first (image_dir_trim: an image's access time is set on every hit).
 *
 * Thread-safety: adapters are immutable after opening and may be shared; the merge functions are
 * reentrant but each borrows a thread pool, which runs one job at a time (threadpool.h). Two
 * processes preparing the same variant at once both merge and the last rename wins (both files
 * are complete and identical): correct, merely wasted work.
 */
#ifndef CORRAL_ADAPTERS_LORA_H
#define CORRAL_ADAPTERS_LORA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/gguf.h"
#include "corral/image.h"
#include "corral/progress.h"
#include "corral/status.h"
#include "corral/threadpool.h"

#define LORA_MAX_ADAPTERS     64
#define LORA_PATH_MAX         4096
/* The image kind of merged models. */
#define LORA_IMAGE_KIND       "merged-model"
#define LORA_KEY_BASE         "corral.lora.base"
#define LORA_KEY_ADAPTERS     "corral.lora.adapters"
/* The image kind of quantized variants (merged first when they have adapters), and the key that
 * records their file type (quantize.h's names, e.g. "Q4_K_M"). */
#define LORA_QUANT_IMAGE_KIND "quantized-model"
#define LORA_KEY_QUANTIZE     "corral.quantize.type"

/* ---- adapters -------------------------------------------------------------------------------- */

typedef enum lora_format {
    LORA_FORMAT_GGUF = 0, /* llama.cpp GGUF LoRA file */
    LORA_FORMAT_PEFT = 1, /* Hugging Face PEFT directory */
} lora_format;

typedef struct lora_adapter lora_adapter;

/* Open the adapter at path (a GGUF LoRA file, or a PEFT directory or one of its two files) for
 * merging into `base` (borrowed for the call only; the adapter keeps what it needs). Every target
 * is checked against the base (see the file comment). Caller owns the result
 * (lora_adapter_destroy); NULL with err naming the adapter, the tensor and the problem. */
lora_adapter *lora_adapter_open(const char *path, const gguf_file *base, corral_error *err);

/* NULL-safe; unmaps; sets *a to NULL. */
void lora_adapter_destroy(lora_adapter **a);

lora_format lora_adapter_format(const lora_adapter *a);

/* The files an adapter path stands for, without opening them: a GGUF adapter, itself; a PEFT
 * adapter (its directory, or a file in it), adapter_config.json and adapter_model.safetensors.
 * These are the files lora_fingerprint reads. Returns how many were written to files (1 or 2),
 * or -1 with err (may be NULL) naming the path when it is neither. */
int lora_adapter_files(const char *path, char files[2][LORA_PATH_MAX], corral_error *err);
const char *lora_adapter_path(const lora_adapter *a); /* as given to lora_adapter_open */

/* Targets: the base tensors the adapter changes, sorted by name. */
uint32_t lora_adapter_target_count(const lora_adapter *a);

typedef struct lora_target_info {
    const char *tensor; /* base tensor name; borrowed, valid while the adapter is */
    uint32_t rank;
    float alpha;   /* as written (GGUF adapter.lora.alpha; PEFT lora_alpha or its pattern) */
    float scaling; /* the factor besides the user's scale: alpha/r, alpha/sqrt(r), or 1 */
    int64_t n_in, n_out;
} lora_target_info;

/* Describe target i (< lora_adapter_target_count). CORRAL_INVALID_ARGUMENT when out of range. */
corral_status lora_adapter_target(const lora_adapter *a, uint32_t i, lora_target_info *out);

/* Index of the target for base tensor `tensor`, or -1. */
int32_t lora_adapter_find_target(const lora_adapter *a, const char *tensor);

/* The low-rank factors of target i in f32, the form every format is brought to: left is
 * n_out x rank and right is rank x n_in (both row-major) such that the target's delta is
 * scaling · left · right in the base tensor's row order (Q/K permutation, embedding transposes
 * applied). Buffers are the caller's. */
corral_status lora_adapter_factors(const lora_adapter *a, uint32_t i, float *left, float *right,
                                   corral_error *err);

/* ---- merging --------------------------------------------------------------------------------- */

/* One adapter in a merge, with the user's scale s. */
typedef struct lora_apply {
    const lora_adapter *adapter; /* borrowed */
    float scale;
} lora_apply;

/* Merge every adapter of list[0..n) that targets base tensor `tensor_index` into dst: the
 * tensor's bytes (its size in the base, same type) with W' = W + sum s·scaling·L·R. Rows no adapter
 * changes are copied unchanged. The work runs on pool (NULL: the calling thread). The adapters
 * must have been opened against `base`. Counts no merge (lora_merge_count counts models).
 * Errors: CORRAL_INVALID_ARGUMENT (index out of range, dst_size wrong), CORRAL_OUT_OF_MEMORY. */
corral_status lora_merge_tensor(const gguf_file *base, uint64_t tensor_index,
                                const lora_apply *list, uint32_t n, threadpool *pool, void *dst,
                                uint64_t dst_size, corral_error *err);

/* An adapter by path, with its scale: the form callers (the CLI, the daemon's variants) use. */
typedef struct lora_source {
    const char *path;
    float scale;
} lora_source;

typedef struct lora_merge_report {
    uint32_t n_adapters;
    uint32_t n_tensors;        /* tensors in the model */
    uint32_t n_merged_tensors; /* tensors some adapter changed */
    uint64_t file_bytes;
    double seconds; /* open, check, merge and write */
    char fingerprint[IMAGE_FINGERPRINT_CHARS + 1];
} lora_merge_report;

/* Merge adapters src[0..n) (1..LORA_MAX_ADAPTERS) into the model at base_path and write the
 * merged model to out_path as a merged-model image, atomically. Every adapter is opened and
 * checked before anything is written. Counts one merge (lora_merge_count). rep may be NULL.
 * Errors as lora_adapter_open, gguf_open and image_writer_write, naming the file; out_path is
 * left as it was on failure. */
corral_status lora_merge_file(const char *base_path, const lora_source *src, uint32_t n,
                              const char *out_path, threadpool *pool, lora_merge_report *rep,
                              corral_error *err);

/* Merge adapters src[0..n) (0..LORA_MAX_ADAPTERS) into the full-precision model at base_path in
 * f32 and quantize the result once to file type `type` (a quantize.h name: "q4_0", "Q4_K_M", ...,
 * with llama-quantize's recipe for it), written to out_path as a quantized-model image,
 * atomically: one rounding instead of the two of merging into an already quantized base. A row
 * is merged exactly as lora_merge_tensor merges it, then quantized as `corral quantize` would
 * quantize that f32 row (so with no adapter the tensor data equal `corral quantize`'s). The
 * image records corral.lora.base, corral.lora.adapters (when n > 0) and corral.quantize.type.
 * Errors: CORRAL_INVALID_ARGUMENT for an unknown type, CORRAL_FAILED_PRECONDITION for a base
 * with a tensor that is not F32, F16 or BF16 (naming it: merging into an already quantized base
 * is lora_merge_file's job), and lora_merge_file's. rep may be NULL. Counts one merge. */
corral_status lora_merge_quantize_file(const char *base_path, const lora_source *src, uint32_t n,
                                       const char *type, const char *out_path, threadpool *pool,
                                       lora_merge_report *rep, corral_error *err);

/* lora_merge_quantize_file, telling `progress` (may be NULL) how far it got: done/total in
 * tensors written, from the calling thread, as each is written. */
corral_status lora_merge_quantize_file_progress(const char *base_path, const lora_source *src,
                                                uint32_t n, const char *type, const char *out_path,
                                                threadpool *pool, const corral_progress *progress,
                                                lora_merge_report *rep, corral_error *err);

/* lora_merge_file, telling `progress` (may be NULL) how far it got: done/total in tensors an
 * adapter changes, from the calling thread, as each is merged. */
corral_status lora_merge_file_progress(const char *base_path, const lora_source *src, uint32_t n,
                                       const char *out_path, threadpool *pool,
                                       const corral_progress *progress, lora_merge_report *rep,
                                       corral_error *err);

/* The fingerprint of a merge of src[0..n) into base_path (see the file comment): what names a
 * variant in the cache. Reads only the files' identities, never whole files. Errors:
 * CORRAL_NOT_FOUND / CORRAL_IO naming a missing or unreadable input. */
corral_status lora_fingerprint(const char *base_path, const lora_source *src, uint32_t n,
                               char out[IMAGE_FINGERPRINT_CHARS + 1], corral_error *err);

/* Merged models produced by this process so far (lora_merge_file and cache misses). Thread-safe;
 * the tests read it to prove that a cache hit did no merge work. */
uint64_t lora_merge_count(void);

/* ---- the cache of merged models -------------------------------------------------------------- */

/* Cached merged models are named LORA_CACHE_FILE_PREFIX<fingerprint>.gguf in the cache directory,
 * quantized variants LORA_QUANT_CACHE_FILE_PREFIX<fingerprint>.gguf. */
#define LORA_CACHE_FILE_PREFIX       "lora-"
#define LORA_QUANT_CACHE_FILE_PREFIX "quant-"

/* "Give me base X with adapters [(path, scale)...], using cache dir D" (and "quantized to Q",
 * which makes a quantized variant: lora_merge_quantize_file's image, from zero or more
 * adapters). */
typedef struct lora_variant_request {
    const char *base_path;
    const lora_source *adapters;
    uint32_t n_adapters;        /* 1..LORA_MAX_ADAPTERS; 0..LORA_MAX_ADAPTERS with quantize */
    const char *quantize;       /* a file type name (quantize.h), or NULL: keep the base's types */
    const char *cache_dir;      /* created (mode 0700) when missing */
    uint64_t cache_limit_bytes; /* after a build, trim the directory to this; 0: no limit */
    threadpool *pool;           /* borrowed, for the merge; NULL: the calling thread */
    image_verify verify;        /* how a cached image is checked before it is used */
    /* Optional: when it becomes nonzero, a merge stops before its next tensor and the call fails
     * with CORRAL_CANCELLED (no partial image is left). Borrowed for the call. */
    const atomic_int *cancel;
    /* Optional: told how a build goes — a merge's done/total in tensors an adapter changes, a
     * quantized build's in tensors written; a cache hit builds nothing and reports nothing. From
     * the calling thread. */
    corral_progress progress;
} lora_variant_request;

typedef struct lora_variant {
    char path[LORA_PATH_MAX]; /* the merged model: give it to model_load */
    char fingerprint[IMAGE_FINGERPRINT_CHARS + 1];
    int cache_hit;         /* 1: an existing image was used, no merge work was done */
    image_problem reason;  /* on a miss, why the image was (re)built (MISSING, FINGERPRINT, ...) */
    double lookup_seconds; /* fingerprint, open and verify of the cached image */
    double merge_seconds;  /* the build on a miss (0 on a hit) */
    uint64_t image_bytes;
    image_trim_report trim; /* what trimming removed after a build */
} lora_variant;

/* Find or build the merged (or quantized) model for a request. On success out->path names a
 * complete, verified (per req->verify) image; a hit refreshes its LRU time. A quantized build logs
 * its progress (log_info, every tenth of its tensors). Errors as lora_fingerprint,
 * lora_merge_file, lora_merge_quantize_file and the cache directory's creation, each naming the
 * file; a failed build leaves no partial file. A corrupt or stale image is replaced, its problem
 * logged and given in out->reason. Thread-safe for different pools. */
corral_status lora_variant_prepare(const lora_variant_request *req, lora_variant *out,
                                   corral_error *err);

/* ---- synthetic adapters (benchmarks, tools) ---------------------------------------------------
 */

/* Which base tensors a synthetic adapter targets. */
enum {
    LORA_SYNTH_ATTN_Q = 1u << 0,
    LORA_SYNTH_ATTN_K = 1u << 1,
    LORA_SYNTH_ATTN_V = 1u << 2,
    LORA_SYNTH_ATTN_OUT = 1u << 3,
    LORA_SYNTH_FFN_GATE = 1u << 4,
    LORA_SYNTH_FFN_UP = 1u << 5,
    LORA_SYNTH_FFN_DOWN = 1u << 6,
    LORA_SYNTH_OUTPUT = 1u << 7,
    LORA_SYNTH_ALL_LINEAR = 0x7f, /* every attention and feed-forward projection */
};

typedef struct lora_synth_params {
    const char *base_path; /* the model whose shapes and architecture the adapter follows */
    uint32_t rank;         /* 1..4096 */
    float alpha;
    uint32_t targets; /* LORA_SYNTH_* bits */
    uint64_t seed;
    float a_std, b_std; /* standard deviations of A's and B's entries (uniform draws) */
    uint32_t type;      /* tensor type of A and B: TENSOR_TYPE_F32 or TENSOR_TYPE_F16 */
} lora_synth_params;

/* Write a llama.cpp-format GGUF LoRA adapter with deterministic random factors (a PRNG seeded by
 * seed and each tensor's name: the same parameters give the same bytes). Atomic. Errors:
 * CORRAL_INVALID_ARGUMENT for bad parameters, the gguf_open errors for the base, CORRAL_IO. */
corral_status lora_synth_write(const lora_synth_params *p, const char *out_path, corral_error *err);

#endif /* CORRAL_ADAPTERS_LORA_H */
