/*
 * model.h — a loaded model, its per-sequence KV caches, and the forward pass.
 *
 * Three objects with separate lifetimes, in the manner of llama2.c's Config/Weights/RunState:
 *   model        the hyperparameters, the tokenizer and the weights. The weights are the GGUF
 *                file's own bytes, memory-mapped read-only, except the matrices the fast kernels
 *                want rearranged (16 rows interleaved): those are mapped from an image in the
 *                cache directory, made on the first load (model_params.cache_dir), or rearranged
 *                in memory at load without one; either way the process holds one copy of each
 *                weight. Immutable after model_load (but for the mark of a fault: see
 *                "Faults"), so one model can serve many threads and sequences.
 *   kv_cache     the attention keys and values of one sequence (a conversation), with the number
 *                of positions filled; it can be extended, truncated and copied.
 *   model_runner scratch buffers for one forward pass at a time (sized for a batch of tokens,
 *                which may belong to several sequences: model_forward_batch), and the thread
 *                pool its passes run on. One per stream of work; a runner can serve any number
 *                of kv caches, in turn or batched together.
 *
 * Threads. A runner made with a thread pool splits every matrix product over the pool's threads
 * by rows of the weight (each thread a contiguous range), attention by heads, and the row
 * operations (norms, rotations) of a long batch by tokens. Every output element is computed by
 * exactly one thread with the same arithmetic in the same order, so the logits are bit-identical
 * whatever the number of threads, the number of tokens per model_forward call, and the other
 * sequences a model_forward_batch call runs beside them.
 *
 * Architectures are rows of a table (engine/src/arch.c): llama (Llama 2/3.x with Llama 3's RoPE
 * scaling, TinyLlama, SmolLM, Mistral), qwen2, qwen3, gemma3 and phi3. An unknown
 * general.architecture is an error naming it.
 *
 * Sliding-window attention (gemma3's local layers) sees only the last n_swa positions, so a KV
 * cache keeps only those of its sliding layers: n_swa + KV_WINDOW_SLACK rows per KV head instead of
 * n_ctx (the slack lets a pass append up to that many positions before the oldest rows are
 * dropped). kv_cache_bytes_for says what a cache of a given context holds.
 */
#ifndef CORRAL_MODEL_H
#define CORRAL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "corral/fault.h"
#include "corral/gguf.h"
#include "corral/image.h"
#include "corral/progress.h"
#include "corral/status.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"

/* How matrix products are computed. */
typedef enum model_compute {
    /* Activations quantized per block to the weight's partner type, as llama.cpp does; the
     * integer dot products of the type's kernel. The default. */
    MODEL_COMPUTE_FAST = 0,
    /* Weights dequantized to F32 and activations never rounded: the exact reference. Slower;
     * used to pin down layouts and numerics in tests. */
    MODEL_COMPUTE_REFERENCE = 1,
} model_compute;

/* Element type of the KV cache. */
typedef enum kv_type {
    KV_TYPE_F16 = 0, /* default: half the memory */
    KV_TYPE_F32 = 1,
} kv_type;

typedef struct model_params {
    model_compute compute;
    /* Where the weights rearranged for the fast kernels (the panel layout of the engine's matrix
     * products) are kept between loads, as a corral image "repack-<name>-<fingerprint>.gguf"
     * made on the first load of a file and mapped on every later one, so that loading costs no
     * rearranging and memory holds one copy of the weights. NULL: rearranged in memory at every
     * load (fine for small models). Borrowed during model_load only. */
    const char *cache_dir;
    /* Told how the rearranging goes when a load rearranges weights (the first load of a file, or
     * one without a cache directory): done/total in tensors, from model_load's thread. A load that
     * maps an existing image rearranges nothing and reports nothing. Optional. */
    corral_progress repack_progress;
    /* 1: never rearrange the weights; every matrix product reads the file's layout (slower). For
     * tools that swap a weight's bytes between passes (quantize's sensitivity probe). */
    int keep_file_layout;
} model_params;

/* Hyperparameters read from the file (keys `<arch>.*`), with derived values. */
typedef struct model_hparams {
    char arch[32];         /* general.architecture */
    char name[128];        /* general.name, or "" */
    uint32_t n_vocab;      /* rows of token_embd */
    uint32_t n_ctx_train;  /* <arch>.context_length */
    uint32_t n_embd;       /* <arch>.embedding_length */
    uint32_t n_layer;      /* <arch>.block_count */
    uint32_t n_head;       /* <arch>.attention.head_count */
    uint32_t n_head_kv;    /* <arch>.attention.head_count_kv (default n_head) */
    uint32_t head_dim;     /* n_embd / n_head, or <arch>.attention.key_length */
    uint32_t n_ff;         /* <arch>.feed_forward_length */
    uint32_t n_rot;        /* <arch>.rope.dimension_count (default head_dim) */
    float rms_eps;         /* <arch>.attention.layer_norm_rms_epsilon */
    float rope_freq_base;  /* <arch>.rope.freq_base (default 10000) */
    float rope_freq_scale; /* 1 / <arch>.rope.scaling.factor for linear/yarn, else 1 */
    char rope_scaling[16]; /* "none", "linear" or "yarn" */
    int tied_output;       /* 1 when output.weight is absent and token_embd is reused */
    int rope_freq_factors; /* 1 when rope_freqs.weight divides the angles (Llama 3 scaling) */
    /* Sliding-window attention (gemma3): a sliding layer's query at position p sees keys
     * p - n_swa + 1 .. p. n_swa 0: no layer slides. */
    uint32_t n_swa;           /* <arch>.attention.sliding_window */
    uint32_t swa_pattern;     /* <arch>.attention.sliding_window_pattern (model_layer_slides) */
    uint32_t n_swa_layers;    /* how many layers slide */
    float rope_freq_base_swa; /* <arch>.rope.freq_base_swa: the sliding layers' RoPE base */
    float logit_softcap;      /* <arch>.final_logit_softcapping: logits c * tanh(l / c); 0: none */
    float attn_scale;         /* the attention scores' factor: 1 / sqrt(head_dim) */
    float embd_scale;         /* the embeddings' factor: 1, or sqrt(n_embd) (gemma) */
} model_hparams;

typedef struct model model;

/* Default parameters: fast compute. */
model_params model_params_default(void);

/* Open, validate and bind a GGUF model: architecture known, every tensor the architecture needs
 * present with the right shape and a supported type, tokenizer readable. Caller owns the result
 * (model_destroy). NULL with err naming the file and the problem (missing tensor, shape, type,
 * unknown architecture, bad hyperparameter). */
model *model_load(const char *path, const model_params *params, corral_error *err);

/* Release the model and unmap its file. NULL-safe; sets *m to NULL. Every kv_cache and
 * model_runner made for it must be destroyed first. */
void model_destroy(model **m);

/* Swapping the weights out and back in, for a supervisor under a memory budget (corrald).
 *
 * model_weights_release gives the weights' memory back: the image of rearranged weights is
 * unmapped (or the in-memory copy freed) and the model file's pages are dropped from the process
 * (madvise DONTNEED: they stay in the page cache, and come back by faults). What is small but
 * costly to rebuild stays: hyperparameters, metadata, the tokenizer (its strings fault back in from
 * the file when used). Runners and KV caches made for the model stay valid; model_forward fails
 * with CORRAL_FAILED_PRECONDITION until the restore. Idempotent.
 *
 * model_weights_restore binds the weights again as model_load does (mapping the cached image,
 * prefetched). It first checks that the file is the one the model was loaded from
 * (model_file_check): CORRAL_FAILED_PRECONDITION when it changed or is gone (load the model anew),
 * other errors as model_load's; the model stays released on any error.
 * model_weights_resident: 0 between a release and a successful restore, else 1. */
void model_weights_release(model *m);
corral_status model_weights_restore(model *m, corral_error *err);
int model_weights_resident(const model *m);

/* Whether the model file is still the one the model was loaded from, by its stamp (image.h:
 * device, inode, size, modification and change times; stat only, no reading). IMAGE_FILE_SAME;
 * IMAGE_FILE_MODIFIED (rewritten, truncated or touched in place: the weights the model maps may
 * now read differently, or fault), or IMAGE_FILE_REPLACED (another file, or none, at the path:
 * the mapping still holds the old file) with err (may be NULL) a CORRAL_FAILED_PRECONDITION
 * message naming the file and what changed. A model mapped from a changed file serves weights
 * other than the file's: load it again. Thread-safe. */
image_file_change model_file_check(const model *m, corral_error *err);

/* A fingerprint of the model file as it was when loaded (image.h: path, size, modification time,
 * inode, first and last 64 KiB), 16 hex digits; "" when the file could not be read for it (no
 * image of the rearranged weights is then cached). What images made from the model's output
 * (saved KV caches) tie themselves to: another file at the path, or this one changed, loads as a
 * model with another fingerprint. Borrowed: valid until model_destroy. */
const char *model_file_fingerprint(const model *m);

/* Faults. The weights are read in place from mapped files; when one is truncated or cannot be
 * read, the read raises SIGBUS. model_forward and model_forward_batch catch it (fault.h) and
 * fail with CORRAL_IO naming the file, the byte and the file's size then and now; the model is
 * then marked faulted for good: every later forward fails the same way (load the file anew).
 *
 * model_note_fault does the same for a fault that a caller caught itself while using the model
 * outside a forward pass (its tokenizer's strings are in the file too): if fi->addr lies in one
 * of the model's mappings the message names that file, else it says the address was outside
 * them; either way the model is marked faulted. Returns CORRAL_IO with err filled.
 * model_fault: the message of the model's first fault, or NULL while it has none. Borrowed: valid
 * until model_destroy. Both thread-safe. */
corral_status model_note_fault(const model *m, const fault_info *fi, corral_error *err);
const char *model_fault(const model *m);

/* Borrowed: valid until model_destroy. */
const model_hparams *model_get_hparams(const model *m);
const tokenizer *model_get_tokenizer(const model *m);
const gguf_file *model_get_gguf(const model *m);

/* Bytes of tensor data the forward pass reads (all weights). */
uint64_t model_weight_bytes(const model *m);

/* 1 when layer il has sliding-window attention (hparams n_swa), else 0 (also for il out of
 * range). Thread-safe. */
int model_layer_slides(const model *m, uint32_t il);

/* The name prefix of those images in a cache directory (for image_dir_trim). */
#define MODEL_REPACK_FILE_PREFIX "repack-"

/* The image in model_params.cache_dir that holds this model's weights in the kernels' layout, or
 * NULL (no cache directory, nothing to rearrange, or reference mode). Borrowed: valid until
 * model_destroy. */
const char *model_repack_path(const model *m);

/* ---- KV cache -------------------------------------------------------------------------------- */

typedef struct kv_cache kv_cache;

/* The rows a sliding layer keeps beyond its window: a pass appends at most this many positions
 * of one cache (longer runs of tokens are cut into passes), and the rows of positions that no
 * later query can see are dropped when the next pass would not fit. */
#define KV_WINDOW_SLACK 512u

/* A cache for up to n_ctx positions (1..n_ctx_train; 0 means n_ctx_train). Caller owns it
 * (kv_cache_destroy). NULL with err when n_ctx is out of range or memory runs out. */
kv_cache *kv_cache_new(const model *m, uint32_t n_ctx, kv_type type, corral_error *err);

/* The bytes kv_cache_new(m, n_ctx, type) holds in its K and V buffers (two buffers of half that
 * each): per layer n_head_kv * head_dim elements of the type per row, n_ctx rows for a full layer
 * and min(n_ctx, n_swa + KV_WINDOW_SLACK) for a sliding one. n_ctx 0 means n_ctx_train. For
 * budgeting before a cache is made; thread-safe. */
uint64_t kv_cache_bytes_for(const model *m, uint32_t n_ctx, kv_type type);

/* NULL-safe; sets *kv to NULL. */
void kv_cache_destroy(kv_cache **kv);

uint32_t kv_cache_n_pos(const kv_cache *kv); /* positions filled */
uint32_t kv_cache_n_ctx(const kv_cache *kv); /* capacity */
uint64_t kv_cache_bytes(const kv_cache *kv); /* memory held */
kv_type kv_cache_type(const kv_cache *kv);

/* Forget positions n_pos and beyond; returns the positions the cache holds then. That is n_pos
 * (or the positions held, when fewer), except when a sliding layer no longer has the rows of
 * n_pos's window (truncated back by more than KV_WINDOW_SLACK positions): then the cache is
 * emptied and 0 returned, and the caller runs the tokens again. */
uint32_t kv_cache_truncate(kv_cache *kv, uint32_t n_pos);

/* Make dst hold exactly src's positions. Both must belong to the same model and type, and dst's
 * capacity must hold src's positions; CORRAL_INVALID_ARGUMENT otherwise. */
corral_status kv_cache_copy(kv_cache *dst, const kv_cache *src, corral_error *err);

/* The first position whose rows a layer holds: 0 for a full layer; for a sliding layer, the
 * oldest position kept (every later one up to n_pos is kept too). 0 for a layer out of range. */
uint32_t kv_cache_layer_first(const kv_cache *kv, uint32_t layer);

/* The stored rows of one layer and KV head, for writing a cache out (swap): positions
 * [kv_cache_layer_first, n_pos) of the keys (values when `values` is nonzero), contiguous,
 * *row_bytes bytes per position (head_dim elements of the cache type). Borrowed: valid until the
 * cache changes or is destroyed. NULL for a layer or head out of range. */
const void *kv_cache_rows(const kv_cache *kv, uint32_t layer, uint32_t kv_head, int values,
                          size_t *row_bytes);

/* Fill one layer and KV head's keys (or values) at positions [first, n) from rows laid out as
 * kv_cache_rows gives them, and make the cache hold n positions (swap-in). A full layer takes
 * first 0; a sliding layer any first that keeps the window of position n (first <= n - n_swa + 1,
 * or 0) with at most its rows, the same first for every sliding layer. CORRAL_INVALID_ARGUMENT
 * when the layer, the head, first or n is out of range. Call it for every layer's and head's keys
 * and values. */
corral_status kv_cache_load_rows(kv_cache *kv, uint32_t layer, uint32_t kv_head, int values,
                                 const void *rows, uint32_t first, uint32_t n, corral_error *err);

/* ---- forward pass -----------------------------------------------------------------------------
 */

typedef struct model_runner model_runner;

/* Scratch for batches of up to max_batch tokens (0 means 512), whose forward passes run on
 * `pool` (NULL: on the calling thread alone). Caller owns it (model_runner_destroy). Borrows m and
 * pool: both must outlive the runner. Per-thread scratch is sized for the pool's thread count.
 * NULL with err: CORRAL_INVALID_ARGUMENT for a batch over 65536, CORRAL_OUT_OF_MEMORY. */
model_runner *model_runner_new(const model *m, uint32_t max_batch, threadpool *pool,
                               corral_error *err);

/* NULL-safe; sets *r to NULL. */
void model_runner_destroy(model_runner **r);

/* Watching the matrix products of a runner's forward passes (calibration: imatrix.h). The
 * observer is called on the thread that runs the pass, once per weight matrix per product,
 * before the product: `weight` is that matrix's data in the model file (gguf_tensor.data of its
 * tensor in model_get_gguf(m), whatever layout the kernels use), and x[n_tok][n_in] the product's
 * input rows (borrowed for the call; floats, before any rounding to the weight's partner type).
 * The logits do not change. */
typedef void (*model_matmul_observer)(void *user, const void *weight, const float *x,
                                      int64_t n_tok, int64_t n_in);

/* Set (fn non-NULL) or clear (fn NULL) r's observer; user is passed back to it. Not while a
 * forward pass runs on r. */
void model_runner_set_observer(model_runner *r, model_matmul_observer fn, void *user);

/* Which logits model_forward writes. */
typedef enum model_logits {
    MODEL_LOGITS_NONE = 0, /* none (prompt prefill whose logits are not needed) */
    MODEL_LOGITS_LAST = 1, /* n_vocab floats: the prediction after the last token */
    MODEL_LOGITS_ALL = 2,  /* n_tokens x n_vocab floats: the prediction after each token */
} model_logits;

/* Run tokens[0..n_tokens) at the next positions of kv (appending them), in batches of the
 * runner's max_batch, and write the requested logits: the one-sequence case of
 * model_forward_batch, with the same results bit for bit. n_tokens 0 does nothing. Errors: as
 * model_forward_batch's (CORRAL_INVALID_ARGUMENT for a token id outside the vocabulary or a cache
 * of another model, CORRAL_RESOURCE_EXHAUSTED when the tokens do not fit in the cache's context,
 * CORRAL_FAILED_PRECONDITION while the weights are released, CORRAL_IO when a mapped weight could
 * not be read or the model faulted before: see "Faults"); nothing is appended on any error.
 * Not thread-safe for the same runner or kv cache; different (runner, kv) pairs may run
 * concurrently on one model, except runners that share a thread pool (a pool runs one pass at a
 * time: see threadpool.h). */
corral_status model_forward(model_runner *r, kv_cache *kv, const int32_t *tokens, uint32_t n_tokens,
                            model_logits which, float *logits, corral_error *err);

/* One sequence's part of a batched forward pass. */
typedef struct model_seq {
    kv_cache *kv;          /* the sequence's cache: its tokens go at kv's next positions */
    const int32_t *tokens; /* n_tokens >= 1 ids */
    uint32_t n_tokens;
    float *logits; /* n_vocab floats: the prediction after the sequence's last token; NULL: none */
} model_seq;

/* Run the tokens of several sequences through the model together (continuous batching): every
 * matrix product takes the tokens of all of them as one batch, so the weights are read once for
 * the whole batch, while the row operations are per token and attention per sequence, over its
 * own cache (a token sees its cache's positions up to its own, the batch's earlier tokens of the
 * same sequence included). Prefill chunks of some sequences and single decode tokens of others
 * mix freely. Sequence i's tokens are appended to seqs[i].kv and seqs[i].logits (when set)
 * receives the prediction after its last token: bit-identical to what
 * model_forward(r, kv, tokens, n_tokens, MODEL_LOGITS_LAST, logits) gives for that sequence run
 * alone, on every kernel path and for any thread count, order or mix of sequences.
 *
 * A batch of more tokens than the runner's max_batch runs as several passes of up to max_batch
 * tokens, sequences in the order given (one may straddle two passes; its tokens stay in order).
 * Nothing is allocated. n_seqs 0 does nothing.
 *
 * Everything is checked before anything runs, and on any error nothing is appended to any cache:
 * CORRAL_INVALID_ARGUMENT for a NULL kv or tokens, n_tokens 0, a cache of another model, the same
 * cache twice in one call, a token id outside the vocabulary; CORRAL_RESOURCE_EXHAUSTED when a
 * sequence does not fit its cache's context; CORRAL_FAILED_PRECONDITION while the weights are
 * released; CORRAL_IO when the weights fault, now or before (see "Faults": then too, nothing is
 * appended to any cache). Each message names the sequence (its index in seqs). seqs, their tokens
 * and logits are borrowed for the call. Thread-safety as model_forward's: one call at a time per
 * runner and per cache. */
corral_status model_forward_batch(model_runner *r, const model_seq *seqs, uint32_t n_seqs,
                                  corral_error *err);

#endif /* CORRAL_MODEL_H */
