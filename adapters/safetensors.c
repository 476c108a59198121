/*
 * safetensors.c — the safetensors reader (format and checks in safetensors.h).
 *
 * Opening maps the file, bounds the header length against the limit and the file, parses the
 * header with the strict JSON reader, turns every entry into a safetensors_tensor after checking
 * its fields, and finally sorts the tensors by offset to prove that they tile the data buffer
 * exactly: no byte outside it, none shared, none left over. Only then are data pointers set.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/tensor.h"
#include "adapter_json.h"

typedef struct dtype_info {
    const char *name;
    size_t size;
} dtype_info;

static const dtype_info dtypes[SAFETENSORS_DTYPE_COUNT] = {
    [SAFETENSORS_F64] = {"F64", 8},         [SAFETENSORS_F32] = {"F32", 4},
    [SAFETENSORS_F16] = {"F16", 2},         [SAFETENSORS_BF16] = {"BF16", 2},
    [SAFETENSORS_I64] = {"I64", 8},         [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I16] = {"I16", 2},         [SAFETENSORS_I8] = {"I8", 1},
    [SAFETENSORS_U64] = {"U64", 8},         [SAFETENSORS_U32] = {"U32", 4},
    [SAFETENSORS_U16] = {"U16", 2},         [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_BOOL] = {"BOOL", 1},       [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1},
    [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
};

#define DTYPE_LIST \
    "F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2"

const char *safetensors_dtype_name(safetensors_dtype t) {
    return (unsigned)t < SAFETENSORS_DTYPE_COUNT ? dtypes[t].name : "?";
}

size_t safetensors_dtype_size(safetensors_dtype t) {
    return (unsigned)t < SAFETENSORS_DTYPE_COUNT ? dtypes[t].size : 0;
}

struct safetensors_file {
    char *path;
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    json_t *header;     /* keeps the names and metadata strings alive */
    const json_t *meta; /* "__metadata__" or NULL */
    safetensors_tensor *tensors;
    uint64_t n_tensors;
    uint64_t *by_name; /* tensor indices sorted by name */
};

void safetensors_destroy(safetensors_file **fp) {
    if (!fp || !*fp) return;
    safetensors_file *f = *fp;
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    json_decref(f->header);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
    *fp = NULL;
}

const char *safetensors_path(const safetensors_file *f) {
    return f->path;
}

uint64_t safetensors_tensor_count(const safetensors_file *f) {
    return f->n_tensors;
}

const safetensors_tensor *safetensors_tensor_at(const safetensors_file *f, uint64_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

uint64_t safetensors_tensor_elements(const safetensors_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->shape[d];
    return n;
}

/* qsort contexts (the comparison functions have no argument for them). */
static _Thread_local const safetensors_file *sort_file;

static int by_name_cmp(const void *a, const void *b) {
    const safetensors_tensor *x = &sort_file->tensors[*(const uint64_t *)a];
    const safetensors_tensor *y = &sort_file->tensors[*(const uint64_t *)b];
    return strcmp(x->name, y->name);
}

static int by_offset_cmp(const void *a, const void *b) {
    const safetensors_tensor *x = &sort_file->tensors[*(const uint64_t *)a];
    const safetensors_tensor *y = &sort_file->tensors[*(const uint64_t *)b];
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return 0;
}

const safetensors_tensor *safetensors_find_tensor(const safetensors_file *f, const char *name) {
    if (!f || !name) return NULL;
    uint64_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const safetensors_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

const char *safetensors_metadata(const safetensors_file *f, const char *key) {
    return f && f->meta && key ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

/* One tensor entry of the header: checks its fields and fills *t (offset and size relative to
 * the buffer; data pointers are set later). */
static corral_status parse_entry(const safetensors_file *f, const char *name, const json_t *v,
                                 uint64_t buffer_size, safetensors_tensor *t, corral_error *err) {
    const char *path = f->path;
    if (!json_is_object(v)) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': the header entry is not an object (found %s)",
                                path, name, adapter_json_kind(v));
    }
    const char *k;
    json_t *field;
    json_object_foreach((json_t *)v, k, field) {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: tensor '%s': unknown field '%.64s'",
                                    path, name, k);
        }
    }
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    if (!dt) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: tensor '%s': no \"dtype\" string", path,
                                name);
    }
    int found = -1;
    for (int i = 0; i < SAFETENSORS_DTYPE_COUNT; i++) {
        if (strcmp(dt, dtypes[i].name) == 0) found = i;
    }
    if (found < 0) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': bad dtype '%.32s' (known: " DTYPE_LIST ")", path,
                                name, dt);
    }
    t->dtype = (safetensors_dtype)found;

    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape)) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: tensor '%s': no \"shape\" array", path,
                                name);
    }
    if (json_array_size(shape) > SAFETENSORS_MAX_DIMS) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': %zu dimensions (at most %d are read)", path, name,
                                json_array_size(shape), SAFETENSORS_MAX_DIMS);
    }
    t->n_dims = (uint32_t)json_array_size(shape);
    uint64_t bytes = safetensors_dtype_size(t->dtype);
    bool overflow = false;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t dim;
        if (adapter_json_u64(json_array_get(shape, d), &dim) != 0) {
            return corral_error_set(
                err, CORRAL_FORMAT,
                "%s: tensor '%s': shape[%" PRIu32 "] is not a non-negative integer", path, name, d);
        }
        t->shape[d] = (int64_t)dim;
        overflow |= __builtin_mul_overflow(bytes, dim, &bytes);
    }
    const json_t *offs = json_object_get(v, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        adapter_json_u64(json_array_get(offs, 0), &begin) != 0 ||
        adapter_json_u64(json_array_get(offs, 1), &end) != 0) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': \"data_offsets\" is not [begin, end] of "
                                "non-negative integers",
                                path, name);
    }
    if (begin > end) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] end before they begin",
                                path, name, begin, end);
    }
    if (end > buffer_size) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] run past the end of the %" PRIu64 "-byte data buffer",
                                path, name, begin, end, buffer_size);
    }
    if (overflow || bytes != end - begin) {
        char dims[128] = "";
        size_t used = 0;
        for (uint32_t d = 0; d < t->n_dims && used < sizeof dims; d++) {
            int w =
                snprintf(dims + used, sizeof dims - used, "%s%" PRId64, d ? ", " : "", t->shape[d]);
            if (w < 0) break;
            used += (size_t)w;
        }
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tensor '%s': shape [%s] of %s needs %s bytes but "
                                "data_offsets give %" PRIu64,
                                path, name, dims, dtypes[t->dtype].name,
                                overflow ? "more than 2^64" : "a different number of", end - begin);
    }
    t->name = name;
    t->offset = begin;
    t->size = end - begin;
    return CORRAL_OK;
}

/* Proves that the tensors tile the data buffer exactly. */
static corral_status check_layout(safetensors_file *f, uint64_t buffer_size, corral_error *err) {
    uint64_t n = f->n_tensors;
    uint64_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < n; i++) order[i] = i;
    sort_file = f;
    qsort(order, n, sizeof *order, by_offset_cmp);
    sort_file = NULL;
    corral_status st = CORRAL_OK;
    uint64_t expected = 0;
    const safetensors_tensor *prev = NULL;
    for (uint64_t i = 0; i < n && st == CORRAL_OK; i++) {
        const safetensors_tensor *t = &f->tensors[order[i]];
        if (t->offset < expected) {
            st = corral_error_set(err, CORRAL_FORMAT,
                                  "%s: tensors '%s' (bytes %" PRIu64 "..%" PRIu64
                                  ") and '%s' (bytes %" PRIu64 "..%" PRIu64
                                  ") overlap in the data buffer",
                                  f->path, prev->name, prev->offset, prev->offset + prev->size,
                                  t->name, t->offset, t->offset + t->size);
        } else if (t->offset > expected) {
            st = corral_error_set(err, CORRAL_FORMAT,
                                  "%s: bytes %" PRIu64 "..%" PRIu64
                                  " of the data buffer belong to no tensor (a hole before '%s')",
                                  f->path, expected, t->offset, t->name);
        }
        expected = t->offset + t->size;
        prev = t;
    }
    if (st == CORRAL_OK && expected != buffer_size) {
        st = corral_error_set(err, CORRAL_FORMAT,
                              "%s: the data buffer has %" PRIu64 " bytes but its tensors end at "
                              "byte %" PRIu64 " (trailing bytes belong to no tensor)",
                              f->path, buffer_size, expected);
    }
    free(order);
    return st;
}

static safetensors_file *file_parse(const uint8_t *base, uint64_t size, const char *path,
                                    bool mapped, corral_error *err) {
    safetensors_file *f = calloc(1, sizeof *f);
    char *path_copy = strdup(path);
    if (!f || !path_copy) {
        free(f);
        free(path_copy);
        if (mapped) munmap((void *)base, size);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    f->path = path_copy;
    f->base = base;
    f->size = size;
    f->mapped = mapped;

    if (size < 8) {
        corral_error_set(err, CORRAL_FORMAT,
                         "%s: file truncated: %" PRIu64
                         " bytes (a safetensors file starts with an 8-byte header length)",
                         path, size);
        goto fail;
    }
    uint64_t n = 0;
    for (unsigned i = 0; i < 8; i++) n |= (uint64_t)base[i] << (8 * i);
    if (n > SAFETENSORS_HEADER_MAX || n > size - 8) {
        corral_error_set(err, CORRAL_FORMAT, "%s: header length %" PRIu64 " is absurd: %s", path, n,
                         n > size - 8 ? "larger than the rest of the file"
                                      : "over the 100 MB limit");
        goto fail;
    }
    if (n < 2 || base[8] != '{') {
        corral_error_set(err, CORRAL_FORMAT, "%s: the header is not a JSON object", path);
        goto fail;
    }
    f->header = adapter_json_parse((const char *)base + 8, (size_t)n, path, err);
    if (!f->header) {
        corral_error_prefix(err, "bad safetensors header");
        goto fail;
    }
    const json_t *root = f->header;
    if (!json_is_object(root)) {
        corral_error_set(err, CORRAL_FORMAT, "%s: the header is not a JSON object", path);
        goto fail;
    }
    uint64_t buffer_size = size - 8 - n;
    const uint8_t *buffer = base + 8 + n;
    size_t members = json_object_size(root);
    f->tensors = calloc(members ? members : 1, sizeof *f->tensors);
    f->by_name = calloc(members ? members : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach((json_t *)root, key, klen, v) {
        if (klen != strlen(key)) {
            corral_error_set(err, CORRAL_FORMAT, "%s: a tensor name contains a NUL byte", path);
            goto fail;
        }
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                corral_error_set(err, CORRAL_FORMAT, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    corral_error_set(err, CORRAL_FORMAT,
                                     "%s: __metadata__ value '%.64s' is not a string", path, mk);
                    goto fail;
                }
            }
            f->meta = v;
            continue;
        }
        if (parse_entry(f, key, v, buffer_size, &f->tensors[f->n_tensors], err) != CORRAL_OK) {
            goto fail;
        }
        f->n_tensors++;
    }
    if (check_layout(f, buffer_size, err) != CORRAL_OK) goto fail;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        f->tensors[i].data = buffer + f->tensors[i].offset;
        f->by_name[i] = i;
    }
    sort_file = f;
    qsort(f->by_name, f->n_tensors, sizeof *f->by_name, by_name_cmp);
    sort_file = NULL;
    return f;
fail:
    safetensors_destroy(&f);
    return NULL;
}

safetensors_file *safetensors_open(const char *path, corral_error *err) {
    if (!path) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "safetensors_open: path is NULL");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s: cannot open: %s",
                         path, strerror(e));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        corral_error_set(err, CORRAL_IO, "%s: not a regular file", path);
        return NULL;
    }
    if (st.st_size < 8 || (uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        corral_error_set(err, CORRAL_FORMAT,
                         "%s: file truncated: %lld bytes (a safetensors file starts with an "
                         "8-byte header length)",
                         path, (long long)st.st_size);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        corral_error_set(err, CORRAL_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        return NULL;
    }
    return file_parse(map, size, path, true, err);
}

safetensors_file *safetensors_open_buffer(const void *data, size_t size, const char *name,
                                          corral_error *err) {
    if (!name) name = "<buffer>";
    if (!data) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s: NULL buffer", name);
        return NULL;
    }
    return file_parse(data, size, name, false, err);
}

corral_status safetensors_tensor_to_f32(const safetensors_tensor *t, uint64_t first, uint64_t n,
                                        float *dst, corral_error *err) {
    uint64_t total = safetensors_tensor_elements(t);
    if (first > total || n > total - first) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor '%s': elements %" PRIu64 "..%" PRIu64
                                " outside its %" PRIu64,
                                t->name, first, first + n, total);
    }
    const uint8_t *p = t->data;
    switch (t->dtype) {
        case SAFETENSORS_F32:
            memcpy(dst, p + first * 4, (size_t)n * 4);
            return CORRAL_OK;
        case SAFETENSORS_F16:
        case SAFETENSORS_BF16:
            for (uint64_t i = 0; i < n; i++) {
                const uint8_t *q = p + (first + i) * 2;
                uint16_t h = (uint16_t)(q[0] | q[1] << 8);
                dst[i] =
                    t->dtype == SAFETENSORS_F16 ? tensor_fp16_to_f32(h) : tensor_bf16_to_f32(h);
            }
            return CORRAL_OK;
        default:
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "tensor '%s': dtype %s cannot be read as floats (F32, F16 and "
                                    "BF16 can)",
                                    t->name, dtypes[t->dtype].name);
    }
}
