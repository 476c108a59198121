/*
 * quantize.h — making a quantized model file from a full-precision one, as llama-quantize does,
 * plus what it does not: error reports, and a size budget met with the least measured error.
 *
 * A file type (quantize_ftype: llama.cpp's llama_ftype, stored as general.file_type) names a
 * default tensor type and, for the K-quant mixtures, a recipe that gives some tensors more bits.
 * The plan (quantize_plan) decides each tensor's type exactly as llama.cpp's
 * llama_tensor_get_type does, in the same order (tensors sorted by layer, then name), so that
 * with the same options the output is byte-identical to llama-quantize's:
 *   - only tensors with 2 or more dimensions whose name ends in "weight" are quantized, never
 *     norms and a list of small special tensors (tensor_allows_quantization's list);
 *   - output.weight (or token_embd.weight when the output is tied to it) gets Q6_K for every
 *     quantized file type but Q8_0 (Q8_0 when its rows do not fit the type's blocks);
 *   - the mixtures: Q4_K_M and Q5_K_M give attn_v (and attn_qkv) and ffn_down Q6_K in the layers
 *     use_more_bits picks (the first and last eighth, and every third layer between); Q4_K_S gives
 *     the first 4 attn_v Q5_K and the first eighth of the ffn_down Q5_K; with an importance matrix
 *     Q4_0/Q5_0 give the first eighth of ffn_down Q4_1/Q5_1; 70B-class and 8-expert models get
 *     llama.cpp's extra rules;
 *   - "Q4_K" and "Q5_K" are llama-quantize's aliases of Q4_K_M and Q5_K_M; --pure (params.pure)
 *     gives every quantized tensor the default type;
 *   - a tensor whose rows do not fit the chosen type's blocks falls back as in llama.cpp (Q4_K to
 *     Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, then F16). Where llama.cpp has no fallback and fails (a
 *     block-of-32 type on rows of, say, 172), the tensor is kept in F16, llama.cpp's own last
 *     resort, with a warning: the one place corral writes a file llama-quantize refuses to.
 * Overrides, in llama.cpp's precedence: token_embedding_type and output_tensor_type first; then
 * the first --tensor-type rule whose pattern is found in the tensor's name (the caller matches:
 * quantize_match_fn); then the recipe.
 *
 * Writing (quantize_file, quantize_write) streams: tensors are produced one at a time while the
 * output is written (gguf_builder fill callbacks), each split by rows over a thread pool, a
 * thread converting its rows to f32 in a buffer of its own, so memory is the largest output
 * tensor plus a few rows per thread; the input is only mapped. The output is written atomically
 * (a temporary file renamed over the path). Metadata: the input's keys, then
 * general.quantization_version = 2 and general.file_type, then (with an importance matrix)
 * quantize.imatrix.{file,dataset,entries_count,chunks_count}, as llama-quantize writes them.
 *
 * Importance (params.imatrix): the tensor's entry in the matrix is given to the type's weighted
 * quantizer (tensor.h); a tensor without an entry is quantized as without a matrix; an entry of
 * the wrong size is an error (except for token_embd, as in llama.cpp).
 *
 * Errors (params.measure, and always for target_bpw): for every quantized tensor, the relative
 * RMS error of its weights, sqrt(sum (W - Q(W))^2 / sum W^2), and with an importance matrix the
 * relative RMS error of its output on the calibration activations,
 * sqrt(sum_ij a_j (W - Q(W))_ij^2 / sum_ij a_j W_ij^2), a_j the importance of column j (exact when
 * the activations' columns are uncorrelated).
 *
 * A size budget (params.target_bpw: bits per weight over all tensors, as llama.cpp counts BPW)
 * chooses each eligible tensor's type (those the recipe would quantize and no override names)
 * among the quantized types its rows fit (Q4_0, Q4_K, Q4_1, Q5_0, Q5_K, Q5_1, Q6_K, Q8_0, F16),
 * to minimise the total error within the budget. The error of a tensor at a type is its output's
 * noise-to-signal ratio (the square of the relative output error above; of the weights' error
 * without an importance matrix), weighted by how directly that noise reaches the logits: in a
 * pre-norm residual network the output projection puts its noise straight into the logits while
 * each of the 2 * n_layer branch outputs and the embedding is one share of the residual stream,
 * so output.weight (or a tied token_embd) weighs 2 * n_layer + 1; attn_q and attn_k reach the
 * output only through the softmax of the scores, which damps their noise, and weigh 1/4; every
 * other tensor weighs 1. With calibration text (params.calibration_text) each tensor's weight is
 * measured instead: the model (the input file) runs on the text once as it is and once per
 * eligible tensor with that tensor alone quantized to its smallest candidate, and the weight is
 * the mean KL divergence of the latter from the former over the scored tokens, divided by that
 * candidate's noise-to-signal ratio. (Quantization noise changes the logits' distribution by an
 * amount about proportional to its power, and the noises of different tensors add, so the
 * weighted errors predict the file's KL divergence.) The rule is greedy over convex hulls, the
 * classic one for this multiple-choice knapsack:
 *   1. for each tensor, its candidates (type, bytes, error) sorted by bytes, the dominated ones
 *      (more bytes, no less error) and those under the lower convex hull dropped, so each
 *      upgrade along the hull costs more bytes per unit of error saved than the one before;
 *   2. every tensor starts at its smallest candidate; while an upgrade fits the budget, take the
 *      one that saves the most error per extra byte over all tensors (ties: the earlier tensor);
 *   3. when the next best upgrade does not fit, try the others in the same order of ratio, so
 *      that leftover bytes are still used.
 * The budget is an upper bound: the file is at most target_bpw bits per weight, never above
 * (an error when even the smallest candidates do not fit).
 *
 * Thread-safety: the functions are reentrant; each uses the pool it is given, which runs one job
 * at a time (threadpool.h).
 */
#ifndef CORRAL_QUANTIZE_H
#define CORRAL_QUANTIZE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/gguf.h"
#include "corral/imatrix.h"
#include "corral/status.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"

/* llama.cpp's file types (llama_ftype): the value written to general.file_type. */
typedef enum quantize_ftype {
    QUANTIZE_FTYPE_F32 = 0,
    QUANTIZE_FTYPE_F16 = 1,
    QUANTIZE_FTYPE_Q4_0 = 2,
    QUANTIZE_FTYPE_Q4_1 = 3,
    QUANTIZE_FTYPE_Q8_0 = 7,
    QUANTIZE_FTYPE_Q5_0 = 8,
    QUANTIZE_FTYPE_Q5_1 = 9,
    QUANTIZE_FTYPE_Q4_K_S = 14,
    QUANTIZE_FTYPE_Q4_K_M = 15,
    QUANTIZE_FTYPE_Q5_K_S = 16,
    QUANTIZE_FTYPE_Q5_K_M = 17,
    QUANTIZE_FTYPE_Q6_K = 18,
    QUANTIZE_FTYPE_BF16 = 32,
} quantize_ftype;

/* Parse a file type name case-insensitively: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_S Q4_K_M
 * Q5_K_S Q5_K_M Q6_K, and llama-quantize's aliases Q4_K (Q4_K_M) and Q5_K (Q5_K_M). Returns 0 and
 * sets *out, or -1. */
int quantize_ftype_from_name(const char *name, quantize_ftype *out);

/* "Q4_K_M"; "?" for a value not in the enum. */
const char *quantize_ftype_name(quantize_ftype f);

/* The names quantize_ftype_from_name accepts, comma-separated (for usage messages). Static. */
const char *quantize_ftype_names(void);

/* The tensor type a file type quantizes to by default (Q4_K for Q4_K_M); TENSOR_TYPE_COUNT for a
 * value not in the enum. */
tensor_type quantize_ftype_default_type(quantize_ftype f);

/* One --tensor-type rule: tensors whose name the pattern is found in get `type`. */
typedef struct quantize_override {
    const char *pattern; /* borrowed for the call */
    tensor_type type;
} quantize_override;

/* 1 when rule `rule` (an index into params.overrides) matches tensor `name`, else 0. The quantize
 * functions call it for each rule in order until one matches. */
typedef int (*quantize_match_fn)(void *user, uint32_t rule, const char *name);

/* The f32 values of rows of a tensor, for writes whose data does not come from the input file as
 * it is (a merge of adapters: adapters/lora.h). begin(user, index) is called once before a
 * tensor's rows are asked for, on the writing thread; rows(user, index, row0, n_rows, dst) fills
 * dst with rows [row0, row0 + n_rows) of tensor `index` (n_rows * ne[0] floats) and may be called
 * from several threads at once; end(user, index) once after. Each returns CORRAL_OK or an error
 * with err filled (rows: the first error of a tensor is kept). */
typedef struct quantize_source {
    const uint8_t *from_source; /* per input tensor: 1 = its rows come from rows(), and it is
                                   (re)quantized even when its type does not change */
    corral_status (*begin)(void *user, uint64_t index, corral_error *err);
    corral_status (*rows)(void *user, uint64_t index, int64_t row0, int64_t n_rows, float *dst,
                          corral_error *err);
    void (*end)(void *user, uint64_t index);
    void *user;
} quantize_source;

/* After each tensor is written (or measured, in a pass for target_bpw): done of total. */
typedef void (*quantize_progress_fn)(void *user, const char *phase, uint32_t done, uint32_t total,
                                     const char *tensor, uint32_t src_type, uint32_t type);

typedef struct quantize_params {
    quantize_ftype ftype;
    int pure;                           /* every quantized tensor gets the default type (--pure) */
    int allow_requantize;               /* accept quantized input tensors (dequantized first) */
    int leave_output;                   /* keep output.weight as it is (--leave-output-tensor) */
    int output_tensor_type;             /* a tensor_type for output.weight, or -1 */
    int token_embedding_type;           /* a tensor_type for token_embd.weight, or -1 */
    const quantize_override *overrides; /* --tensor-type rules, in order */
    uint32_t n_overrides;
    quantize_match_fn match; /* required when n_overrides > 0 */
    void *match_user;
    const imatrix *imatrix;   /* borrowed; NULL: none */
    const char *imatrix_path; /* recorded as quantize.imatrix.file; may be NULL */
    double target_bpw;        /* > 0: choose types to fit this many bits per weight */
    /* Calibration text for target_bpw (NULL: none): each eligible tensor's sensitivity is then
     * measured on it (see above) instead of taken from its role. Needs an input file corral can
     * run as a model, and no source. */
    const char *calibration_text;
    size_t calibration_len;
    uint32_t calibration_tokens;   /* evaluate at most this many tokens of it (0: 512) */
    int measure;                   /* measure every quantized tensor's error */
    threadpool *pool;              /* borrowed; NULL: the calling thread */
    const quantize_source *source; /* NULL: every tensor from the input file */
    quantize_progress_fn progress; /* may be NULL */
    void *progress_user;
    const atomic_int *cancel; /* nonzero: stop before the next tensor (CORRAL_CANCELLED) */
    /* Write a corral image (image.h) of this kind and fingerprint instead of a plain GGUF file;
     * both NULL for a plain file. */
    const char *image_kind;
    const char *image_fingerprint;
    /* Extra metadata, added after the rest (e.g. a merged model's corral.lora.* keys): called
     * with the output's builder before any tensor is added. May be NULL. */
    corral_status (*add_metadata)(void *user, gguf_builder *b, corral_error *err);
    void *metadata_user;
} quantize_params;

/* quantize_params with every field at its default: Q8_0 (llama-quantize's default file type),
 * no overrides (-1 for the two type options), no budget. */
quantize_params quantize_params_default(void);

#define QUANTIZE_NAME_MAX 128

/* Tokens of calibration text the size budget evaluates unless told (quantize_params). */
#define QUANTIZE_CALIBRATION_TOKENS 512

/* Why a tensor has its type. */
typedef enum quantize_reason {
    QUANTIZE_REASON_KEPT = 0,     /* not a tensor llama.cpp quantizes: copied */
    QUANTIZE_REASON_DEFAULT = 1,  /* the file type's default type (or --pure) */
    QUANTIZE_REASON_RECIPE = 2,   /* the mixture's rule (output, attn_v, ffn_down, ...) */
    QUANTIZE_REASON_OVERRIDE = 3, /* --tensor-type, --output-tensor-type, --token-embedding-type */
    QUANTIZE_REASON_FALLBACK = 4, /* rows do not fit the chosen type's blocks */
    QUANTIZE_REASON_BUDGET = 5,   /* chosen by target_bpw */
    QUANTIZE_REASON_COUNT
} quantize_reason;

/* "kept", "default", "recipe", "override", "fallback", "budget"; "?" otherwise. */
const char *quantize_reason_name(quantize_reason r);

typedef struct quantize_tensor_info {
    char name[QUANTIZE_NAME_MAX];
    uint64_t index; /* in the input file */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t n_elements;
    uint32_t src_type, type;
    uint64_t src_bytes, bytes;
    quantize_reason reason;
    int converted;       /* its bytes are produced (quantized or converted), not copied */
    int importance;      /* an importance matrix entry was used */
    int measured;        /* the two errors below are set */
    double weight_error; /* relative RMS error of the weights */
    double output_error; /* relative RMS error of the output on the calibration activations, or
                            -1 without an importance matrix */
    double sensitivity;  /* chosen by the budget: the weight of its noise-to-signal ratio (its
                            role's, or measured with calibration text); else 0 */
} quantize_tensor_info;

typedef struct quantize_result {
    quantize_tensor_info
        *tensors; /* n_tensors, in the output's order; owned (quantize_result_free) */
    uint32_t n_tensors;
    uint64_t n_elements;          /* over all tensors */
    uint64_t bytes_in, bytes_out; /* tensor data */
    double bpw_in, bpw_out;       /* bits per weight: bytes * 8 / n_elements */
    uint32_t n_fallback;          /* tensors whose type fell back */
    uint32_t n_importance;        /* tensors quantized with an importance matrix entry */
    /* With calibration text: the sum of the budget's weighted errors, a prediction of the file's
     * mean KL divergence from the input on that text (about right when the tensors' errors add
     * up: docs/quantize.md); -1 otherwise. */
    double predicted_kl;
    double seconds;
} quantize_result;

/* Free what a result holds (not the struct). NULL-safe. */
void quantize_result_free(quantize_result *r);

/* Decide every tensor's type for `in` without writing anything (llama-quantize's --dry-run), and
 * with target_bpw or measure, measure the errors (which quantizes every candidate in memory).
 * Fills *out (quantize_result_free). Errors: CORRAL_INVALID_ARGUMENT for bad parameters (an
 * unknown file type, overrides without a matcher, a type the engine cannot write, a budget below
 * the smallest possible file, naming it), CORRAL_UNSUPPORTED for a quantized input tensor without
 * allow_requantize or a type that cannot be converted, CORRAL_FORMAT for an importance matrix entry
 * of the wrong size; each naming the tensor. */
corral_status quantize_plan(const gguf_file *in, const quantize_params *params,
                            quantize_result *out, corral_error *err);

/* Plan and write the quantized model of `in` to out_path (atomically; on any failure nothing is
 * left at out_path, an older file there is kept). out may be NULL. Errors: quantize_plan's,
 * CORRAL_CANCELLED, the source's, CORRAL_IO naming the path. */
corral_status quantize_write(const gguf_file *in, const char *out_path,
                             const quantize_params *params, quantize_result *out,
                             corral_error *err);

/* quantize_write of the file at in_path (opened and checked with gguf_open). in_path and out_path
 * must not name the same file (CORRAL_INVALID_ARGUMENT). */
corral_status quantize_file(const char *in_path, const char *out_path,
                            const quantize_params *params, quantize_result *out, corral_error *err);

#endif /* CORRAL_QUANTIZE_H */
