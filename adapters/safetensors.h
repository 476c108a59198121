/*
 * safetensors.h — reading safetensors files (Hugging Face's tensor container, the format of PEFT
 * adapters' adapter_model.safetensors), validated as strictly as corral's GGUF reader.
 *
 * The format (all integers little-endian):
 *   1. uint64 N: the length of the header.
 *   2. N bytes: a JSON object (UTF-8; may be padded at the end with spaces). Each member but
 *      "__metadata__" is a tensor: "name": {"dtype": "F32", "shape": [d0, d1, ...],
 *      "data_offsets": [begin, end]}; "__metadata__" is an optional object of string values.
 *   3. The data buffer: every byte after the header. A tensor's bytes are
 *      buffer[begin, end), row-major with the last dimension contiguous (shape [rows, cols] is
 *      rows of cols elements: GGUF's ne[0] = cols, ne[1] = rows).
 *
 * Checks, all before anything else is trusted: N is at most SAFETENSORS_HEADER_MAX and leaves
 * the header inside the file; the header parses as strict JSON (adapter_json.h) and is an
 * object; every tensor entry has exactly the three fields with the right types; the dtype is a
 * known one;
 * shape dimensions are non-negative integers, at most SAFETENSORS_MAX_DIMS of them, whose product
 * times the dtype's size neither overflows nor differs from end - begin; begin <= end <= the
 * buffer's size; no two tensors share a byte; and the tensors cover the buffer with no hole (as
 * the reference implementation requires, so a file corral accepts is one every reader accepts).
 * Errors are CORRAL_FORMAT naming the file, the tensor and the problem.
 *
 * The file is memory-mapped read-only; tensor data pointers point into the mapping. The handle
 * is immutable after opening and may be shared by threads.
 */
#ifndef CORRAL_ADAPTERS_SAFETENSORS_H
#define CORRAL_ADAPTERS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

/* Largest header accepted (the reference implementation's limit). */
#define SAFETENSORS_HEADER_MAX (100u * 1000u * 1000u)
#define SAFETENSORS_MAX_DIMS   8

/* Element types. Append only. */
typedef enum safetensors_dtype {
    SAFETENSORS_F64 = 0,
    SAFETENSORS_F32 = 1,
    SAFETENSORS_F16 = 2,
    SAFETENSORS_BF16 = 3,
    SAFETENSORS_I64 = 4,
    SAFETENSORS_I32 = 5,
    SAFETENSORS_I16 = 6,
    SAFETENSORS_I8 = 7,
    SAFETENSORS_U64 = 8,
    SAFETENSORS_U32 = 9,
    SAFETENSORS_U16 = 10,
    SAFETENSORS_U8 = 11,
    SAFETENSORS_BOOL = 12,
    SAFETENSORS_F8_E4M3 = 13,
    SAFETENSORS_F8_E5M2 = 14,
    SAFETENSORS_DTYPE_COUNT
} safetensors_dtype;

/* "F32", ... as written in files; "?" outside the enum. Static. */
const char *safetensors_dtype_name(safetensors_dtype t);

/* Bytes per element; 0 outside the enum. */
size_t safetensors_dtype_size(safetensors_dtype t);

/* One tensor. Borrowed: valid until the file is destroyed. */
typedef struct safetensors_tensor {
    const char *name; /* NUL-terminated */
    safetensors_dtype dtype;
    uint32_t n_dims;                     /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS]; /* as in the file: shape[n_dims-1] is contiguous */
    uint64_t offset;                     /* begin, relative to the data buffer */
    uint64_t size;                       /* end - begin */
    const void *data;                    /* into the mapping */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* Map and validate the file at path. Caller owns the result (safetensors_destroy). NULL with err:
 * CORRAL_NOT_FOUND / CORRAL_IO for the file system, CORRAL_FORMAT for anything malformed, each
 * message naming the path (and tensor). */
safetensors_file *safetensors_open(const char *path, corral_error *err);

/* Validate a file image in memory (tests, fuzzing): borrowed, must outlive the handle. */
safetensors_file *safetensors_open_buffer(const void *data, size_t size, const char *name,
                                          corral_error *err);

/* NULL-safe; unmaps; sets *f to NULL. */
void safetensors_destroy(safetensors_file **f);

const char *safetensors_path(const safetensors_file *f);

/* Tensors in the order of the header. */
uint64_t safetensors_tensor_count(const safetensors_file *f);
const safetensors_tensor *safetensors_tensor_at(const safetensors_file *f, uint64_t i);

/* The tensor named `name`, or NULL. */
const safetensors_tensor *safetensors_find_tensor(const safetensors_file *f, const char *name);

/* The string value of key in "__metadata__", or NULL. Borrowed. */
const char *safetensors_metadata(const safetensors_file *f, const char *key);

/* Elements of a tensor (the product of its shape; 1 for a scalar). */
uint64_t safetensors_tensor_elements(const safetensors_tensor *t);

/* Convert elements [first, first + n) of an F32, F16 or BF16 tensor to float (F16 and BF16
 * exactly, as the engine's conversions do). CORRAL_UNSUPPORTED naming the tensor and its dtype for
 * other dtypes; CORRAL_INVALID_ARGUMENT when the range exceeds the tensor. */
corral_status safetensors_tensor_to_f32(const safetensors_tensor *t, uint64_t first, uint64_t n,
                                        float *dst, corral_error *err);

#endif /* CORRAL_ADAPTERS_SAFETENSORS_H */
