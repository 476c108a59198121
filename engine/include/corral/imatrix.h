/*
 * imatrix.h — importance matrices: how much each input column of each weight matrix matters,
 * measured on calibration text, for the importance-weighted quantizers (tensor.h,
 * quantize_weighted) and the error estimates of quantize.h.
 *
 * For a weight matrix W (rows of n_in) the importance of column j is the mean, over the tokens of
 * the calibration text, of the square of the activation x[j] that column multiplies: the error a
 * rounding dW[i][j] causes in the layer's output is then about importance[j] * dW[i][j]^2. (It is
 * the diagonal of E[x x^T]; quantize.h's output error is exact when the columns are
 * uncorrelated.)
 *
 * The file is llama.cpp's imatrix GGUF format, so that llama-quantize reads corral's files and
 * corral reads llama-imatrix's:
 *   1. metadata: general.type = "imatrix"; imatrix.datasets (array of strings: the calibration
 *      files); imatrix.chunk_count (uint32: chunks of text evaluated); imatrix.chunk_size (uint32:
 *      tokens per chunk);
 *   2. per weight matrix NAME (sorted by name), two F32 tensors: "NAME.in_sum2", the sums of the
 *      squared activations per column, ne = [n_in, n_mat] (n_mat 1 for a plain matrix, the
 *      number of experts for a 3-D one; written 1-D when n_mat is 1, as ggml writes it), and
 *      "NAME.counts", ne = [1, n_mat]: the tokens each matrix saw.
 * The importance of a column is in_sum2 / counts (1 where a matrix saw no token), as
 * llama-quantize computes it. The older binary format of llama-imatrix (".dat": int32 entry count;
 * per entry a length-prefixed name, int32 ncall, int32 n_values, n_values floats already divided
 * by the count and multiplied by ncall; optionally int32 chunk count and a length-prefixed dataset
 * name) is read too: importance = value / ncall.
 *
 * Computing one (imatrix_compute) follows llama-imatrix: the text, tokenized once with BOS, is cut
 * into chunks of n_ctx tokens (the remainder dropped), each chunk's first token replaced by BOS
 * and evaluated from an empty KV cache with every position's logits; the input of every matrix
 * product whose weight is named "blk.*" (and output.weight when asked) is accumulated.
 *
 * Thread-safety: an imatrix is immutable once loaded or computed and may be shared.
 */
#ifndef CORRAL_IMATRIX_H
#define CORRAL_IMATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "corral/model.h"
#include "corral/status.h"
#include "corral/threadpool.h"

/* Limits on what a file may hold, checked before anything is allocated for it. */
#define IMATRIX_MAX_ENTRIES  65536
#define IMATRIX_MAX_NAME     255
#define IMATRIX_MAX_DATASETS 64

typedef struct imatrix imatrix;

/* Read an importance matrix file (GGUF, or llama-imatrix's older binary format). Every count,
 * type and size is checked against the file. Caller owns the result (imatrix_destroy). NULL with
 * err naming the path and the problem: CORRAL_NOT_FOUND / CORRAL_IO for the file system,
 * CORRAL_FORMAT for a malformed file (a missing .counts, a type other than F32, sizes that do not
 * divide, a negative or non-finite value, no entries). */
imatrix *imatrix_load(const char *path, corral_error *err);

/* imatrix_load of a file already in memory (tests, fuzzing): the buffer is only read during the
 * call; `name` is used in messages. */
imatrix *imatrix_load_buffer(const void *data, size_t size, const char *name, corral_error *err);

/* Write im to path in the GGUF format, atomically. CORRAL_IO naming the path on failure. */
corral_status imatrix_save(const imatrix *im, const char *path, corral_error *err);

/* NULL-safe; sets *im to NULL. */
void imatrix_destroy(imatrix **im);

/* An empty importance matrix, to fill with imatrix_set (tools, tests). Caller owns the result;
 * NULL when out of memory. */
imatrix *imatrix_new(void);

/* Add (or replace) the entry `tensor`: importance[0..n) for one matrix, as seen over `tokens`
 * tokens (stored as sums importance * tokens and that count, so that a saved file reads back the
 * same importance). CORRAL_INVALID_ARGUMENT for n 0, tokens 0, a negative or non-finite value or a
 * name over IMATRIX_MAX_NAME bytes; CORRAL_OUT_OF_MEMORY. */
corral_status imatrix_set(imatrix *im, const char *tensor, const float *importance, uint64_t n,
                          uint64_t tokens, corral_error *err);

/* Entries: one per weight matrix, sorted by name. */
uint32_t imatrix_n_entries(const imatrix *im);
const char *imatrix_entry_name(const imatrix *im, uint32_t i); /* borrowed; NULL out of range */

/* The importance of every column of the matrix named `tensor`, n_in * n_mat floats (see the file
 * comment), with *n set to that count; NULL when im has no entry of that name. Borrowed: valid
 * until imatrix_destroy. */
const float *imatrix_find(const imatrix *im, const char *tensor, uint64_t *n);

/* Tokens the entry saw (its largest count over its matrices); 0 for a name it does not hold. */
uint64_t imatrix_entry_tokens(const imatrix *im, const char *tensor);

uint32_t imatrix_chunk_count(const imatrix *im);
uint32_t imatrix_chunk_size(const imatrix *im);
/* The calibration files recorded (imatrix.datasets), borrowed; NULL for i out of range. */
uint32_t imatrix_n_datasets(const imatrix *im);
const char *imatrix_dataset(const imatrix *im, uint32_t i);

/* Called after each chunk of imatrix_compute: chunks done of n_chunks. */
typedef void (*imatrix_progress_fn)(void *user, uint32_t done, uint32_t n_chunks);

typedef struct imatrix_params {
    uint32_t n_ctx;      /* tokens per chunk: 16..the model's context; 0 means 512 (or the
                            model's context when smaller) */
    uint32_t max_chunks; /* evaluate at most this many chunks; 0: all */
    int process_output;  /* also collect output.weight's input (llama-imatrix's
                            --process-output) */
    const char *dataset; /* the calibration file's name, recorded in imatrix.datasets; may be
                            NULL */
    imatrix_progress_fn progress; /* may be NULL */
    void *progress_user;
} imatrix_params;

/* Compute the importance matrix of model m over tokens[0..n_tokens) (the whole text tokenized
 * once, with BOS; see the file comment). The forward passes run on pool (borrowed; NULL: the
 * calling thread), which must not run anything else meanwhile. Caller owns the result.
 * NULL with err: CORRAL_INVALID_ARGUMENT when the text makes fewer than 2 chunks or n_ctx is out
 * of range (naming the numbers), the forward pass's errors, CORRAL_OUT_OF_MEMORY. */
imatrix *imatrix_compute(const model *m, threadpool *pool, const int32_t *tokens, size_t n_tokens,
                         const imatrix_params *params, corral_error *err);

#endif /* CORRAL_IMATRIX_H */
