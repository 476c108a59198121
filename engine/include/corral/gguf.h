/*
 * gguf.h — reading (and writing) GGUF files, the model format of llama.cpp/ggml.
 *
 * The file format, versions 2 and 3 (all integers little-endian):
 *   1. magic: the 4 bytes "GGUF"
 *   2. uint32 version (1 is rejected: it used 32-bit counts; 2 and 3 are read)
 *   3. uint64 n_tensors, 4. uint64 n_kv
 *   5. n_kv metadata pairs: key (string), uint32 value type (gguf_type), value.
 *      A string is uint64 length + that many bytes (UTF-8, not NUL-terminated). An array is
 *      uint32 element type + uint64 count + the elements (arrays of strings and of arrays allowed).
 *   6. n_tensors tensor infos: name (string), uint32 n_dims (1..4), n_dims x uint64 ne (ne[0] is
 *      the contiguous row length), uint32 tensor type (tensor_type), uint64 offset of the data
 *      relative to the data section (a multiple of the alignment).
 *   7. padding to `general.alignment` (uint32, a power of two; default 32), then the data section.
 *
 * Reading maps the file read-only and checks every count, length, type id, dimension, offset and
 * size against the file before using it; nothing in a file can make the reader read outside the
 * mapping, overflow an integer or allocate more than the file could justify. The handle is
 * immutable after gguf_open, so it may be shared by threads.
 */
#ifndef CORRAL_GGUF_H
#define CORRAL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "corral/progress.h"
#include "corral/status.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

/* A string inside the mapping: `len` bytes at `data`, NOT NUL-terminated. Borrowed: valid until
 * the file is destroyed. */
typedef struct gguf_str {
    const char *data;
    uint64_t len;
} gguf_str;

/* One tensor's description. `data` points into the mapping (aligned to the file's alignment
 * relative to the data section); `size` is the exact byte size of ne[0..n_dims) elements of
 * `type`. Unused dimensions are 1. Borrowed: valid until the file is destroyed. */
typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint32_t type;   /* a tensor_type id (corral/tensor.h); checked to be a known one */
    uint64_t offset; /* relative to the data section */
    uint64_t size;   /* bytes */
    const void *data;
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Map and validate the file at `path` (a file of 2 MiB or more at a 2 MiB-aligned address, so
 * that the kernel can map it in 2 MiB pages where the page cache holds it so; gguf_advise_pages
 * says which stretches want that). Caller owns the result (gguf_destroy). On failure returns
 * NULL and fills err: CORRAL_NOT_FOUND / CORRAL_IO for the file system, CORRAL_UNSUPPORTED for
 * version 1 or a big-endian file, CORRAL_FORMAT for anything malformed, with a message naming the
 * path, what was wrong and where (key name, tensor name, byte offset). */
gguf_file *gguf_open(const char *path, corral_error *err);

/* gguf_open for a file that is read whole, again and again (an image of weights or state): all of
 * it GGUF_PAGES_STREAMED (gguf_advise_pages) before its header is read, so that the kernel reads
 * even its first pages into 2 MiB pages. */
gguf_file *gguf_open_streamed(const char *path, corral_error *err);

/* Validate a GGUF image already in memory (tests, fuzzing). The buffer is borrowed: it must stay
 * valid and unchanged until gguf_destroy. `name` is used in messages. */
gguf_file *gguf_open_buffer(const void *data, size_t size, const char *name, corral_error *err);

/* Unmap and free. NULL-safe; sets *f to NULL. */
void gguf_destroy(gguf_file **f);

uint32_t gguf_version(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);
const char *gguf_path(const gguf_file *f);   /* the path or name given at open */
uint64_t gguf_file_size(const gguf_file *f); /* bytes of the whole file */
const void *gguf_file_data(const gguf_file *f);   /* start of the mapping */

/* Drop a mapped file's pages from the process (madvise DONTNEED): its resident memory falls to
 * nothing and the pages come back from the page cache (or the disk) by faults on the next access.
 * Nothing for a file parsed from a caller's buffer. */
void gguf_release_pages(const gguf_file *f);

/* The same for the pages of [p, p + n) only (the whole pages it touches; the part outside the
 * mapping is ignored): a reader that streams through a file once (corral quantize) keeps its
 * resident memory at what it is reading now. Nothing for a file parsed from a caller's buffer. */
void gguf_release_range(const gguf_file *f, const void *p, size_t n);

/* How a stretch of a mapped file is read, for the kernel's choice of page size. */
typedef enum gguf_page_use {
    GGUF_PAGES_STREAMED, /* read whole, again and again (weights a matrix product streams): 2 MiB
                            pages, read ahead in 2 MiB pages */
    GGUF_PAGES_SPARSE,   /* read here and there (embedding rows, norms, bytes never read again):
                            4 KiB pages, so that a few bytes read map 4 KiB and not 2 MiB */
} gguf_page_use;

/* Advise the kernel how [p, p + n) of f's mapping is read (madvise MADV_HUGEPAGE or
 * MADV_NOHUGEPAGE over the pages it touches; the part outside the mapping is ignored). Advice
 * only: nothing for a file parsed from a caller's buffer or a kernel without transparent huge
 * pages, and the contents read the same either way. */
void gguf_advise_pages(const gguf_file *f, const void *p, size_t n, gguf_page_use use);
uint64_t gguf_data_offset(const gguf_file *f);    /* file offset of the data section */

/* ---- metadata ------------------------------------------------------------------------------- */

uint64_t gguf_kv_count(const gguf_file *f);
gguf_str gguf_kv_key(const gguf_file *f, uint64_t i);   /* i < gguf_kv_count */
gguf_type gguf_kv_type(const gguf_file *f, uint64_t i); /* the value's type */

/* Index of `key`, or -1 when absent. Keys are unique (duplicates are rejected at open). */
int64_t gguf_find_key(const gguf_file *f, const char *key);

/* Typed getters by key. Each returns CORRAL_OK and sets *out, CORRAL_NOT_FOUND when the key is
 * absent, or CORRAL_FORMAT when the value has another type or does not fit; err names the key and
 * the types. Integer getters accept any integer (or bool) type whose value fits the target;
 * gguf_get_f32/f64 accept FLOAT32 and FLOAT64. */
corral_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, corral_error *err);
corral_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, corral_error *err);
corral_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, corral_error *err);
corral_status gguf_get_f32(const gguf_file *f, const char *key, float *out, corral_error *err);
corral_status gguf_get_bool(const gguf_file *f, const char *key, int *out, corral_error *err);
corral_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, corral_error *err);

/* Arrays. gguf_get_array gives the element type and count of the array at `key` (CORRAL_FORMAT
 * when the value is not an array). */
corral_status gguf_get_array(const gguf_file *f, const char *key, gguf_type *elem_type,
                             uint64_t *count, corral_error *err);

/* Copy the whole numeric array at `key` into dst, converting: to f32 from FLOAT32/FLOAT64; to
 * i32 from any integer type whose every value fits. `n` must equal the array's count (else
 * CORRAL_FORMAT naming both). */
corral_status gguf_array_copy_f32(const gguf_file *f, const char *key, float *dst, uint64_t n,
                                  corral_error *err);
corral_status gguf_array_copy_i32(const gguf_file *f, const char *key, int32_t *dst, uint64_t n,
                                  corral_error *err);

/* Element i of the string array at metadata index kv (constant time: the reader indexes string
 * arrays at open). Returns {NULL, 0} when kv is not a string array or i is out of range. */
gguf_str gguf_array_str(const gguf_file *f, uint64_t kv, uint64_t i);

/* A one-line rendering of metadata value i for `corral inspect`: numbers and bools as text,
 * strings quoted and escaped and cut at ~80 bytes, arrays as "[type x count] first items ...".
 * Writes at most size bytes (NUL-terminated); returns the length written. */
size_t gguf_format_value(const gguf_file *f, uint64_t i, char *buf, size_t size);

/* The name of a metadata value type ("uint32", "string", ...); "?" for unknown values. */
const char *gguf_type_name(gguf_type type);

/* ---- tensors -------------------------------------------------------------------------------- */

uint64_t gguf_tensor_count(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i); /* i < gguf_tensor_count */

/* The tensor named `name`, or NULL. Names are unique (duplicates are rejected at open). */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* 1 if the gguf_str equals the NUL-terminated string s. */
int gguf_str_eq(gguf_str a, const char *s);

/* ---- writing -------------------------------------------------------------------------------- */

/* A GGUF file under construction: metadata and tensors are added in order, then written in one
 * go. Used by `corral synth`, merged-model caches and tests that need crafted files. */
typedef struct gguf_builder gguf_builder;

/* Caller owns the result (gguf_builder_destroy). NULL when out of memory. */
gguf_builder *gguf_builder_new(void);
void gguf_builder_destroy(gguf_builder **b);

/* Add metadata. Keys and string values are copied. Adding an existing key replaces its value. */
corral_status gguf_builder_set_u32(gguf_builder *b, const char *key, uint32_t v);
corral_status gguf_builder_set_i32(gguf_builder *b, const char *key, int32_t v);
corral_status gguf_builder_set_u64(gguf_builder *b, const char *key, uint64_t v);
corral_status gguf_builder_set_f32(gguf_builder *b, const char *key, float v);
corral_status gguf_builder_set_bool(gguf_builder *b, const char *key, int v);
corral_status gguf_builder_set_str(gguf_builder *b, const char *key, const char *v);
/* Numeric array: `count` elements of `type` (a fixed-size gguf_type) copied from data. */
corral_status gguf_builder_set_array(gguf_builder *b, const char *key, gguf_type type,
                                     const void *data, uint64_t count);
corral_status gguf_builder_set_str_array(gguf_builder *b, const char *key,
                                         const char *const *strs, uint64_t count);
/* Copy metadata value i of an open file (any type, arrays included) under the same key. */
corral_status gguf_builder_copy_kv(gguf_builder *b, const gguf_file *src, uint64_t i);

/* Add a tensor. `data` (tensor_row_size(type, ne[0]) * ne[1] * ... bytes) is borrowed until
 * gguf_builder_write returns. ne[0] must be a multiple of the type's block size. */
corral_status gguf_builder_add_tensor(gguf_builder *b, const char *name, uint32_t type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      corral_error *err);

/* Produces a tensor's bytes while gguf_builder_write runs: fill exactly `size` bytes at dst (a
 * buffer the builder owns, reused between tensors) and return CORRAL_OK, or return an error with
 * err filled; the write then fails and leaves no file behind. `user` and `name` are what was given
 * to gguf_builder_add_tensor_fill. Called once per tensor, in the order the tensors were added,
 * on the thread that calls gguf_builder_write. */
typedef corral_status (*gguf_tensor_fill_fn)(void *user, const char *name, void *dst, uint64_t size,
                                             corral_error *err);

/* Add a tensor whose data is produced at write time by fill(user, ...) instead of being held in
 * memory: a file of any size can then be written while holding one tensor at a time (the largest
 * one). Checks as gguf_builder_add_tensor; `user` is borrowed until gguf_builder_write returns.
 * A file may mix tensors added either way; the bytes written are the same as if the data had been
 * passed to gguf_builder_add_tensor. */
corral_status gguf_builder_add_tensor_fill(gguf_builder *b, const char *name, uint32_t type,
                                           uint32_t n_dims, const int64_t *ne,
                                           gguf_tensor_fill_fn fill, void *user, corral_error *err);

/* Write the file atomically: to "<path>.tmp.<pid>", fsync, rename over path. Uses the builder's
 * `general.alignment` if set (else 32). Tensors added with gguf_builder_add_tensor_fill are
 * produced now, one at a time, into one buffer the size of the largest of them. */
corral_status gguf_builder_write(gguf_builder *b, const char *path, corral_error *err);

/* Let gguf_builder_write pause at pace's pace callback (corral_progress_pace) before each tensor
 * and between the 8 MiB pieces it writes a tensor in; NULL: none. Borrowed until the write. */
void gguf_builder_set_pace(gguf_builder *b, const corral_progress *pace);

#endif /* CORRAL_GGUF_H */
