/*
 * gguf.c — the GGUF reader and writer (format in corral/gguf.h).
 *
 * Reading is one pass over the mapped bytes with a bounded cursor (gguf_cursor): every read says
 * what it needs, and the cursor fails with a message instead of reading past the end. Counts are
 * checked against what the remaining bytes could possibly hold before anything is allocated for
 * them, so a 2^60 count in a 1 KB file fails at once instead of asking malloc for an exabyte.
 * Values are not copied: the handle keeps, for each metadata pair, where its value lies in the
 * mapping, plus an offset index for string arrays (vocabularies of 150k tokens are read by index
 * in constant time). Keys and tensor names go into small open-addressing hash tables built at
 * open, which also catch duplicates.
 *
 * Writing (gguf_builder) keeps each metadata value already serialized, so copying a value from
 * an open file — arrays of arrays included — is a byte copy, and writing is a straight
 * concatenation: header, metadata, tensor infos, padding, tensor data (each padded). Tensor data
 * is either borrowed from the caller or produced during the write by a fill callback, one tensor
 * at a time, so that `corral synth` can write a multi-gigabyte model holding only its largest
 * tensor in memory.
 */
#include "corral/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/log.h"
#include "corral/tensor.h"
#include "corral/utf8.h"

#define GGUF_VERSION_WRITTEN       3
/* Arrays of arrays are legal; nesting deeper than this is rejected (no real file nests at all,
 * and the limit bounds the reader's recursion). */
#define GGUF_ARRAY_DEPTH_MAX       8
/* The fewest bytes a metadata pair can take: key length (8) + empty key + type (4) + 1-byte value.
 */
#define GGUF_KV_MIN_BYTES          13
/* The fewest bytes a tensor info can take: name length (8) + n_dims (4) + one ne (8) + type (4) +
 * offset (8). */
#define GGUF_TENSOR_INFO_MIN_BYTES 32
/* An array header inside an array: element type (4) + count (8). */
#define GGUF_ARRAY_HEADER_BYTES    12
/* Longest key or tensor name quoted in a message before it is cut. */
#define GGUF_MESSAGE_NAME_MAX      96

/* ---- metadata value types ------------------------------------------------------------------ */

typedef struct gguf_type_info {
    const char *name;
    uint32_t size;  /* bytes of one value; 0 for string and array */
    bool is_int;    /* usable by the integer getters (bool counts as 0/1) */
    bool is_signed; /* two's complement */
} gguf_type_info;

static const gguf_type_info gguf_types[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = {"uint8", 1, true, false},
    [GGUF_TYPE_INT8] = {"int8", 1, true, true},
    [GGUF_TYPE_UINT16] = {"uint16", 2, true, false},
    [GGUF_TYPE_INT16] = {"int16", 2, true, true},
    [GGUF_TYPE_UINT32] = {"uint32", 4, true, false},
    [GGUF_TYPE_INT32] = {"int32", 4, true, true},
    [GGUF_TYPE_FLOAT32] = {"float32", 4, false, false},
    [GGUF_TYPE_BOOL] = {"bool", 1, true, false},
    [GGUF_TYPE_STRING] = {"string", 0, false, false},
    [GGUF_TYPE_ARRAY] = {"array", 0, false, false},
    [GGUF_TYPE_UINT64] = {"uint64", 8, true, false},
    [GGUF_TYPE_INT64] = {"int64", 8, true, true},
    [GGUF_TYPE_FLOAT64] = {"float64", 8, false, false},
};

const char *gguf_type_name(gguf_type type) {
    return (unsigned)type < GGUF_TYPE_COUNT ? gguf_types[type].name : "?";
}

/* GGUF is little-endian; decoding byte by byte keeps the reader right on any host and free of
 * unaligned loads. */
static uint64_t load_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* An integer from the file, kept as sign and magnitude so that range checks are exact for every
 * source and target type (the value is -mag when neg). */
typedef struct int_value {
    bool neg;
    uint64_t mag;
} int_value;

static int_value int_load(const uint8_t *p, gguf_type t) {
    unsigned size = gguf_types[t].size;
    uint64_t raw = load_le(p, size);
    int_value v = {false, raw};
    if (gguf_types[t].is_signed && size < 8 && (raw >> (8 * size - 1)) & 1) {
        raw |= ~(uint64_t)0 << (8 * size); /* sign-extend to 64 bits */
    }
    if (gguf_types[t].is_signed && (raw >> 63)) {
        v.neg = true;
        v.mag = ~raw + 1; /* two's complement magnitude; 2^63 for INT64_MIN */
    } else {
        v.mag = raw;
    }
    return v;
}

static bool int_fits_i32(int_value v) {
    return v.neg ? v.mag <= (uint64_t)INT32_MAX + 1 : v.mag <= INT32_MAX;
}

static int32_t int_to_i32(int_value v) {
    return v.neg ? (int32_t)(-(int64_t)(v.mag - 1) - 1) : (int32_t)v.mag;
}

static double float_load(const uint8_t *p, gguf_type t) {
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t bits = (uint32_t)load_le(p, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    uint64_t bits = load_le(p, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* Converting a double outside float's range is undefined behaviour in C, so it is checked. */
static bool float_fits_f32(double d) {
    return !isfinite(d) || fabs(d) <= FLT_MAX;
}

/* Copies s into dst for a message: printable ASCII as is, other bytes as \xNN, cut with "..."
 * past `max` source bytes. File contents can hold anything; messages must stay one clean line. */
static void text_escape(char *dst, size_t cap, const char *s, uint64_t len, uint64_t max) {
    size_t o = 0;
    for (uint64_t i = 0; i < len && i < max && o + 5 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f) {
            dst[o++] = (char)ch;
        } else {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", ch);
        }
    }
    if (len > max && o + 4 < cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

/* ---- name index: open addressing over keys and tensor names -------------------------------- */

/* Slots hold entry index + 1 (0 = empty). The entries are gguf_kv or gguf_tensor records whose
 * first member is their name, so one index type serves both through the record stride. */
typedef struct name_index {
    uint64_t *slots;
    uint64_t mask;
    const void *records;
    size_t stride;
} name_index;

static uint64_t name_hash(const char *s, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3u;
    }
    return h;
}

static bool name_index_init(name_index *ix, uint64_t n, const void *records, size_t stride) {
    uint64_t cap = 8;
    while (cap < 2 * n) cap *= 2; /* load factor at most 1/2; n is bounded by the file size */
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    ix->records = records;
    ix->stride = stride;
    return ix->slots != NULL;
}

static const gguf_str *name_index_record(const name_index *ix, uint64_t i) {
    return (const gguf_str *)((const char *)ix->records + i * ix->stride);
}

/* Index of the record named s, or -1. */
static int64_t name_index_find(const name_index *ix, const char *s, uint64_t len) {
    if (!ix->slots) return -1;
    for (uint64_t h = name_hash(s, len) & ix->mask;; h = (h + 1) & ix->mask) {
        uint64_t slot = ix->slots[h];
        if (slot == 0) return -1;
        const gguf_str *name = name_index_record(ix, slot - 1);
        if (name->len == len && (len == 0 || memcmp(name->data, s, len) == 0)) {
            return (int64_t)(slot - 1);
        }
    }
}

/* Adds record i; returns -1, or the index of an earlier record with the same name. */
static int64_t name_index_add(name_index *ix, uint64_t i) {
    const gguf_str *name = name_index_record(ix, i);
    int64_t dup = name_index_find(ix, name->data, name->len);
    if (dup >= 0) return dup;
    uint64_t h = name_hash(name->data, name->len) & ix->mask;
    while (ix->slots[h] != 0) h = (h + 1) & ix->mask;
    ix->slots[h] = i + 1;
    return -1;
}

/* ---- the open file --------------------------------------------------------------------------- */

typedef struct gguf_kv {
    gguf_str key; /* first: the name index reads it */
    gguf_type type;
    uint64_t value_pos;  /* file offset of the value (just past its type) */
    uint64_t value_size; /* bytes of the whole value, so that it can be copied as is */
    /* Arrays only. */
    gguf_type elem_type;
    uint64_t count;
    uint64_t elems_pos; /* file offset of element 0 */
    uint64_t *str_pos;  /* string arrays: file offset of each element's length field */
} gguf_kv;

struct gguf_file {
    char *path;
    const uint8_t *base;
    uint64_t size;
    bool mapped; /* base is our mmap (else a borrowed buffer) */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv *kvs;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    name_index key_index;
    name_index tensor_index;
};

/* ---- the bounded cursor ---------------------------------------------------------------------- */

typedef struct gguf_cursor {
    const uint8_t *base;
    uint64_t pos;
    uint64_t end;
    const char *path;
    char where[GGUF_MESSAGE_NAME_MAX * 4 + 32]; /* what is being read: "key 'general.name'" */
    corral_error *err;
} gguf_cursor;

/* Fills the error as "PATH: WHERE: MESSAGE (byte offset AT)". Always returns false. */
__attribute__((format(printf, 4, 5))) static bool cur_fail(gguf_cursor *c, corral_status status,
                                                           uint64_t at, const char *fmt, ...) {
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    corral_error_set(c->err, status, "%s: %s%s%s (byte offset %" PRIu64 ")", c->path, c->where,
                     c->where[0] ? ": " : "", msg, at);
    return false;
}

__attribute__((format(printf, 2, 3))) static void cur_where(gguf_cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->where, sizeof c->where, fmt, ap);
    va_end(ap);
}

static void cur_where_clear(gguf_cursor *c) {
    c->where[0] = '\0';
}

/* Names the record being read ("key 'x'", "tensor 'y'"), escaped and cut for the message. */
static void cur_where_name(gguf_cursor *c, const char *kind, gguf_str name) {
    char text[GGUF_MESSAGE_NAME_MAX * 4 + 8];
    text_escape(text, sizeof text, name.data, name.len, GGUF_MESSAGE_NAME_MAX);
    cur_where(c, "%s '%s'", kind, text);
}

static uint64_t cur_left(const gguf_cursor *c) {
    return c->end - c->pos;
}

static bool cur_need(gguf_cursor *c, uint64_t n, const char *what) {
    if (n <= cur_left(c)) return true;
    return cur_fail(c, CORRAL_FORMAT, c->pos,
                    "file truncated: %s needs %" PRIu64 " bytes, only %" PRIu64 " left", what, n,
                    cur_left(c));
}

static bool cur_u32(gguf_cursor *c, uint32_t *v, const char *what) {
    if (!cur_need(c, 4, what)) return false;
    *v = (uint32_t)load_le(c->base + c->pos, 4);
    c->pos += 4;
    return true;
}

static bool cur_u64(gguf_cursor *c, uint64_t *v, const char *what) {
    if (!cur_need(c, 8, what)) return false;
    *v = load_le(c->base + c->pos, 8);
    c->pos += 8;
    return true;
}

/* A string: uint64 length, then that many bytes, which must all be in the file. */
static bool cur_str(gguf_cursor *c, gguf_str *s, const char *what) {
    uint64_t len;
    if (!cur_u64(c, &len, what)) return false;
    if (len > cur_left(c)) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 8,
                        "file truncated: %s has string length %" PRIu64
                        ", past the end of the file (%" PRIu64 " bytes left)",
                        what, len, cur_left(c));
    }
    s->data = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return true;
}

/* A metadata type id; `what` says whose ("value type", "array element type"). */
static bool cur_type(gguf_cursor *c, gguf_type *t, const char *what) {
    uint32_t v;
    if (!cur_u32(c, &v, what)) return false;
    if (v >= GGUF_TYPE_COUNT) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 4, "unknown metadata %s %" PRIu32, what, v);
    }
    *t = (gguf_type)v;
    return true;
}

/* ---- parsing --------------------------------------------------------------------------------- */

static bool check_bools(gguf_cursor *c, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint8_t b = c->base[c->pos + i];
        if (b > 1) {
            return cur_fail(c, CORRAL_FORMAT, c->pos + i, "bad bool value %u (must be 0 or 1)", b);
        }
    }
    return true;
}

/* Checks one value of `type` at the cursor and moves past it. For a top-level value (kv not
 * NULL) it also records the array facts and the string-array index the getters use. `depth` is
 * the number of arrays around this value. */
static bool parse_value(gguf_cursor *c, gguf_type type, unsigned depth, gguf_kv *kv) {
    uint32_t size = gguf_types[type].size;
    if (size) {
        if (!cur_need(c, size, gguf_types[type].name)) return false;
        if (type == GGUF_TYPE_BOOL && !check_bools(c, 1)) return false;
        c->pos += size;
        return true;
    }
    if (type == GGUF_TYPE_STRING) {
        gguf_str s;
        return cur_str(c, &s, "string value");
    }

    /* An array: element type, count, elements. */
    uint64_t at = c->pos;
    gguf_type elem = GGUF_TYPE_UINT8;
    uint64_t count = 0;
    if (!cur_type(c, &elem, "array element type") || !cur_u64(c, &count, "array count")) {
        return false;
    }
    if (depth + 1 > GGUF_ARRAY_DEPTH_MAX) {
        return cur_fail(c, CORRAL_FORMAT, at, "arrays nested more than %d deep",
                        GGUF_ARRAY_DEPTH_MAX);
    }
    uint32_t elem_size = gguf_types[elem].size;
    uint64_t elem_min = elem_size                  ? elem_size
                        : elem == GGUF_TYPE_STRING ? 8
                                                   : GGUF_ARRAY_HEADER_BYTES;
    if (count > cur_left(c) / elem_min) {
        return cur_fail(c, CORRAL_FORMAT, at,
                        "array count %" PRIu64 " of %s is impossible: the %" PRIu64
                        " bytes left hold at most %" PRIu64 " (truncated or corrupt file)",
                        count, gguf_types[elem].name, cur_left(c), cur_left(c) / elem_min);
    }
    if (kv) {
        kv->elem_type = elem;
        kv->count = count;
        kv->elems_pos = c->pos;
    }
    if (elem_size) {
        if (elem == GGUF_TYPE_BOOL && !check_bools(c, count)) return false;
        c->pos += count * elem_size; /* in bounds: checked above */
        return true;
    }
    if (elem == GGUF_TYPE_STRING) {
        if (kv && count > 0) {
            /* count * 8 <= bytes left, so this is bounded by the file size. */
            kv->str_pos = malloc(count * sizeof *kv->str_pos);
            if (!kv->str_pos) {
                return cur_fail(c, CORRAL_OUT_OF_MEMORY, at,
                                "out of memory indexing %" PRIu64 " strings", count);
            }
        }
        for (uint64_t i = 0; i < count; i++) {
            if (kv) kv->str_pos[i] = c->pos;
            gguf_str s;
            if (!cur_str(c, &s, "array string")) return false;
        }
        return true;
    }
    for (uint64_t i = 0; i < count; i++) {
        if (!parse_value(c, elem, depth + 1, NULL)) return false;
    }
    return true;
}

static bool parse_header(gguf_cursor *c, gguf_file *f) {
    cur_where(c, "header");
    if (!cur_need(c, 4, "the magic")) return false;
    if (memcmp(c->base, "GGUF", 4) != 0) {
        char magic[32];
        text_escape(magic, sizeof magic, (const char *)c->base, 4, 4);
        return cur_fail(c, CORRAL_FORMAT, 0, "not a GGUF file: bad magic '%s' (expected 'GGUF')",
                        magic);
    }
    c->pos = 4;
    if (!cur_u32(c, &f->version, "the version")) return false;
    if (f->version == 1) {
        return cur_fail(c, CORRAL_UNSUPPORTED, 4,
                        "GGUF version 1 is not supported (it has 32-bit counts); "
                        "convert the file with a current llama.cpp");
    }
    if (f->version != 2 && f->version != 3) {
        /* A big-endian file's version reads byte-swapped here: 3 shows as 0x03000000. */
        if ((f->version & 0xffffu) == 0) {
            return cur_fail(c, CORRAL_UNSUPPORTED, 4,
                            "big-endian GGUF file (version field reads 0x%08" PRIx32
                            ") is not supported",
                            f->version);
        }
        return cur_fail(c, CORRAL_UNSUPPORTED, 4,
                        "GGUF version %" PRIu32 " is not supported (versions 2 and 3 are)",
                        f->version);
    }
    if (!cur_u64(c, &f->n_tensors, "n_tensors") || !cur_u64(c, &f->n_kv, "n_kv")) return false;
    uint64_t left = cur_left(c);
    if (f->n_kv > left / GGUF_KV_MIN_BYTES) {
        return cur_fail(c, CORRAL_FORMAT, 16,
                        "n_kv %" PRIu64 " is impossible: the %" PRIu64
                        " bytes left hold at most %" PRIu64
                        " key-value pairs (truncated or corrupt file)",
                        f->n_kv, left, left / GGUF_KV_MIN_BYTES);
    }
    left -= f->n_kv * GGUF_KV_MIN_BYTES;
    if (f->n_tensors > left / GGUF_TENSOR_INFO_MIN_BYTES) {
        return cur_fail(c, CORRAL_FORMAT, 8,
                        "n_tensors %" PRIu64 " is impossible: the %" PRIu64
                        " bytes left after the metadata hold at most %" PRIu64
                        " tensor infos (truncated or corrupt file)",
                        f->n_tensors, left, left / GGUF_TENSOR_INFO_MIN_BYTES);
    }
    return true;
}

static bool parse_kvs(gguf_cursor *c, gguf_file *f) {
    f->kvs = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kvs);
    if (!f->kvs || !name_index_init(&f->key_index, f->n_kv, f->kvs, sizeof *f->kvs)) {
        return cur_fail(c, CORRAL_OUT_OF_MEMORY, c->pos, "out of memory for %" PRIu64 " keys",
                        f->n_kv);
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kvs[i];
        cur_where(c, "key #%" PRIu64, i);
        if (!cur_str(c, &kv->key, "key")) return false;
        cur_where_name(c, "key", kv->key);
        if (name_index_add(&f->key_index, i) >= 0) {
            return cur_fail(c, CORRAL_FORMAT, c->pos - kv->key.len - 8, "duplicate key");
        }
        if (!cur_type(c, &kv->type, "value type")) return false;
        kv->value_pos = c->pos;
        if (!parse_value(c, kv->type, 0, kv)) return false;
        kv->value_size = c->pos - kv->value_pos;
    }
    cur_where_clear(c);
    return true;
}

static bool parse_alignment(gguf_cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0) return true;
    const gguf_kv *kv = &f->kvs[i];
    cur_where(c, "key 'general.alignment'");
    if (kv->type != GGUF_TYPE_UINT32) {
        return cur_fail(c, CORRAL_FORMAT, kv->value_pos, "must be a uint32, not %s",
                        gguf_types[kv->type].name);
    }
    uint32_t a = (uint32_t)load_le(c->base + kv->value_pos, 4);
    if (a == 0 || (a & (a - 1)) != 0) {
        return cur_fail(c, CORRAL_FORMAT, kv->value_pos,
                        "alignment %" PRIu32 " is not a nonzero power of two", a);
    }
    f->alignment = a;
    cur_where_clear(c);
    return true;
}

/* Reads the dimensions and type of tensor t and works out its byte size, refusing anything that
 * does not describe a real array: bad n_dims, negative extents, rows that are not whole blocks,
 * element counts or byte sizes that overflow. */
static bool parse_tensor_shape(gguf_cursor *c, gguf_tensor *t) {
    if (!cur_u32(c, &t->n_dims, "n_dims")) return false;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 4, "n_dims %" PRIu32 " is out of range 1..%d",
                        t->n_dims, GGUF_MAX_DIMS);
    }
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < t->n_dims && !cur_u64(c, &v, "dimension")) return false;
        if (v > INT64_MAX) {
            return cur_fail(c, CORRAL_FORMAT, c->pos - 8, "dimension ne[%" PRIu32 "] is negative",
                            d);
        }
        t->ne[d] = (int64_t)v;
    }
    if (!cur_u32(c, &t->type, "tensor type")) return false;
    const tensor_type_traits *tt = tensor_type_get_traits(t->type);
    if (!tt) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 4, "unknown tensor type id %" PRIu32, t->type);
    }
    if (t->ne[0] % tt->block_size != 0) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 4,
                        "row length ne[0] = %" PRId64
                        " is not a multiple of the block size %" PRId64 " of type %s",
                        t->ne[0], tt->block_size, tt->name);
    }
    int64_t elements = 1;
    uint64_t bytes = (uint64_t)(t->ne[0] / tt->block_size);
    bool overflow = __builtin_mul_overflow(bytes, (uint64_t)tt->type_size, &bytes);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        overflow |= __builtin_mul_overflow(elements, t->ne[d], &elements);
        if (d > 0) overflow |= __builtin_mul_overflow(bytes, (uint64_t)t->ne[d], &bytes);
    }
    if (overflow) {
        return cur_fail(c, CORRAL_FORMAT, c->pos - 4,
                        "dimensions [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                        "] overflow: the element count or byte size does not fit in 64 bits",
                        t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }
    t->size = bytes;
    return true;
}

static bool parse_tensor_infos(gguf_cursor *c, gguf_file *f) {
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors ||
        !name_index_init(&f->tensor_index, f->n_tensors, f->tensors, sizeof *f->tensors)) {
        return cur_fail(c, CORRAL_OUT_OF_MEMORY, c->pos, "out of memory for %" PRIu64 " tensors",
                        f->n_tensors);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        cur_where(c, "tensor #%" PRIu64, i);
        uint64_t at = c->pos;
        if (!cur_str(c, &t->name, "tensor name")) return false;
        cur_where_name(c, "tensor", t->name);
        if (name_index_add(&f->tensor_index, i) >= 0) {
            return cur_fail(c, CORRAL_FORMAT, at, "duplicate tensor name");
        }
        if (!parse_tensor_shape(c, t)) return false;
        if (!cur_u64(c, &t->offset, "data offset")) return false;
        if (t->offset % f->alignment != 0) {
            return cur_fail(c, CORRAL_FORMAT, c->pos - 8,
                            "misaligned data offset %" PRIu64 " (alignment %" PRIu32 ")", t->offset,
                            f->alignment);
        }
    }
    cur_where_clear(c);
    return true;
}

typedef struct tensor_span {
    uint64_t start, end, index;
} tensor_span;

static int span_cmp(const void *a, const void *b) {
    const tensor_span *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Places the data section after the padded header, checks that every tensor's bytes lie inside
 * it and that no two tensors share bytes, and sets the data pointers. */
static bool place_tensors(gguf_cursor *c, gguf_file *f) {
    uint64_t header_end = c->pos;
    uint64_t data_offset = header_end + (f->alignment - header_end % f->alignment) % f->alignment;
    if (data_offset > f->size) {
        if (f->n_tensors > 0) {
            return cur_fail(c, CORRAL_FORMAT, header_end,
                            "file truncated: the data section would start at byte %" PRIu64
                            " but the file has %" PRIu64 " bytes",
                            data_offset, f->size);
        }
        data_offset = f->size; /* files without tensors may end without padding */
    }
    f->data_offset = data_offset;
    uint64_t data_size = f->size - data_offset;

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->size > data_size - t->offset) {
            cur_where_name(c, "tensor", t->name);
            return cur_fail(c, CORRAL_FORMAT, data_offset,
                            "data runs past end of file: offset %" PRIu64 " + size %" PRIu64
                            " exceeds the %" PRIu64 " bytes of the data section",
                            t->offset, t->size, data_size);
        }
        t->data = f->base + data_offset + t->offset;
    }

    if (f->n_tensors < 2) return true;
    tensor_span *spans = malloc(f->n_tensors * sizeof *spans);
    if (!spans) return cur_fail(c, CORRAL_OUT_OF_MEMORY, 0, "out of memory checking tensors");
    uint64_t n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->size > 0) spans[n++] = (tensor_span){t->offset, t->offset + t->size, i};
    }
    qsort(spans, n, sizeof *spans, span_cmp);
    bool ok = true;
    for (uint64_t i = 1; i < n && ok; i++) {
        if (spans[i].start < spans[i - 1].end) {
            const gguf_tensor *a = &f->tensors[spans[i - 1].index];
            const gguf_tensor *b = &f->tensors[spans[i].index];
            char name_a[GGUF_MESSAGE_NAME_MAX * 4 + 8], name_b[sizeof name_a];
            text_escape(name_a, sizeof name_a, a->name.data, a->name.len, GGUF_MESSAGE_NAME_MAX);
            text_escape(name_b, sizeof name_b, b->name.data, b->name.len, GGUF_MESSAGE_NAME_MAX);
            ok = cur_fail(c, CORRAL_FORMAT, data_offset + b->offset,
                          "tensors '%s' (bytes %" PRIu64 "..%" PRIu64 ") and '%s' (bytes %" PRIu64
                          "..%" PRIu64 ") overlap in the data section",
                          name_a, a->offset, a->offset + a->size, name_b, b->offset,
                          b->offset + b->size);
        }
    }
    free(spans);
    return ok;
}

/* Takes ownership of a mapping (mapped) or borrows a buffer; validates it all. */
static gguf_file *file_parse(const uint8_t *base, uint64_t size, const char *path, bool mapped,
                             corral_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
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

    gguf_cursor c = {.base = base, .pos = 0, .end = size, .path = f->path, .err = err};
    bool ok = parse_header(&c, f) && parse_kvs(&c, f) && parse_alignment(&c, f) &&
              parse_tensor_infos(&c, f) && place_tensors(&c, f);
    if (!ok) {
        gguf_destroy(&f);
        return NULL;
    }
    return f;
}

/* Files of at least this size are mapped at an address that is a multiple of it. */
#define GGUF_MAP_ALIGN ((size_t)2 << 20)

/*
 * Map size bytes of fd read-only. A file of 2 MiB or more goes to a 2 MiB-aligned address (a
 * reservation a little larger than the file, the file mapped over it with MAP_FIXED, the rest
 * given back): where the page cache holds a 2 MiB-aligned stretch of the file in one 2 MiB page
 * (ext4 and xfs read files into such pages, the more so in a stretch advised GGUF_PAGES_STREAMED),
 * the kernel can then map it with one page-table entry instead of 512. Weights are read in long
 * streams; on a VM, whose page walks are costly, decoding with a TinyLlama Q4_0 image on 2
 * threads ran at 79-80 tok/s mapped so, 45-54 mapped in 4 KiB pages (README, engine speed).
 * With `streamed` the whole mapping is advised MADV_HUGEPAGE before anything reads it: the
 * kernel's read-ahead from the first fault (parsing the header) would otherwise read the start of
 * the file in small pages, and keep reading ahead in them while the caller populates the rest
 * (measured: the first 40 MiB of a 571 MiB image). MAP_FAILED with errno set on failure.
 */
static void *map_file(int fd, size_t size, bool streamed) {
    if (size < GGUF_MAP_ALIGN) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t mapped = (size + page - 1) / page * page;
    const size_t reserved = mapped + GGUF_MAP_ALIGN;
    uint8_t *area = mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
    if (area == MAP_FAILED) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    uint8_t *start =
        (uint8_t *)(((uintptr_t)area + GGUF_MAP_ALIGN - 1) & ~(uintptr_t)(GGUF_MAP_ALIGN - 1));
    void *map = mmap(start, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (map == MAP_FAILED) {
        const int e = errno;
        munmap(area, reserved);
        errno = e;
        return MAP_FAILED;
    }
    if (start > area) munmap(area, (size_t)(start - area));
    if (start + mapped < area + reserved)
        munmap(start + mapped, (size_t)(area + reserved - (start + mapped)));
    if (streamed) madvise(start, mapped, MADV_HUGEPAGE); /* advice: failure changes nothing */
    return start;
}

static gguf_file *open_file(const char *path, bool streamed, corral_error *err) {
    if (!path) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "gguf_open: path is NULL");
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
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        corral_error_set(err, CORRAL_IO, "%s: cannot stat: %s", path, strerror(e));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        corral_error_set(err, CORRAL_IO, "%s: not a regular file", path);
        return NULL;
    }
    if (st.st_size == 0 || (uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        corral_error_set(err, CORRAL_FORMAT, "%s: file truncated: %s", path,
                         st.st_size == 0 ? "the file is empty" : "too large to map");
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = map_file(fd, size, streamed);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        corral_error_set(err, CORRAL_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        return NULL;
    }
    return file_parse(map, size, path, true, err);
}

gguf_file *gguf_open(const char *path, corral_error *err) {
    return open_file(path, false, err);
}

gguf_file *gguf_open_streamed(const char *path, corral_error *err) {
    return open_file(path, true, err);
}

gguf_file *gguf_open_buffer(const void *data, size_t size, const char *name, corral_error *err) {
    if (!name) name = "<buffer>";
    if (!data || size == 0) {
        corral_error_set(err, data ? CORRAL_FORMAT : CORRAL_INVALID_ARGUMENT,
                         "%s: file truncated: %s", name, data ? "empty buffer" : "NULL buffer");
        return NULL;
    }
    return file_parse(data, size, name, false, err);
}

void gguf_destroy(gguf_file **fp) {
    if (!fp || !*fp) return;
    gguf_file *f = *fp;
    if (f->kvs) {
        for (uint64_t i = 0; i < f->n_kv; i++) free(f->kvs[i].str_pos);
    }
    free(f->kvs);
    free(f->tensors);
    free(f->key_index.slots);
    free(f->tensor_index.slots);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
    *fp = NULL;
}

uint32_t gguf_version(const gguf_file *f) {
    return f->version;
}

uint32_t gguf_alignment(const gguf_file *f) {
    return f->alignment;
}

const char *gguf_path(const gguf_file *f) {
    return f->path;
}

uint64_t gguf_file_size(const gguf_file *f) {
    return f->size;
}

const void *gguf_file_data(const gguf_file *f) {
    return f->base;
}

void gguf_release_pages(const gguf_file *f) {
    /* The mapping starts on a page boundary (mmap's result) and is read-only: no data is lost. */
    if (f && f->mapped && f->size > 0) madvise((void *)f->base, (size_t)f->size, MADV_DONTNEED);
}

void gguf_release_range(const gguf_file *f, const void *p, size_t n) {
    if (!f || !f->mapped || !p || n == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)f->base, hi = lo + (uintptr_t)f->size;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (b < a || a >= hi || b <= lo) return;
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    a &= ~(page - 1);
    b = (b + page - 1) & ~(page - 1);
    madvise((void *)a, b - a, MADV_DONTNEED);
}

void gguf_advise_pages(const gguf_file *f, const void *p, size_t n, gguf_page_use use) {
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    if (!f || !f->mapped || !p || n == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)f->base, hi = lo + (uintptr_t)f->size;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (b < a || a >= hi || b <= lo) return;
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    a &= ~(page - 1);
    b = (b + page - 1) & ~(page - 1);
    madvise((void *)a, b - a, use == GGUF_PAGES_STREAMED ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)f;
    (void)p;
    (void)n;
    (void)use;
#endif
}

uint64_t gguf_data_offset(const gguf_file *f) {
    return f->data_offset;
}

/* ---- metadata -------------------------------------------------------------------------------- */

uint64_t gguf_kv_count(const gguf_file *f) {
    return f->n_kv;
}

gguf_str gguf_kv_key(const gguf_file *f, uint64_t i) {
    return i < f->n_kv ? f->kvs[i].key : (gguf_str){NULL, 0};
}

gguf_type gguf_kv_type(const gguf_file *f, uint64_t i) {
    return i < f->n_kv ? f->kvs[i].type : GGUF_TYPE_COUNT;
}

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    if (!f || !key) return -1;
    return name_index_find(&f->key_index, key, strlen(key));
}

/* The pair named key, or NOT_FOUND naming it. */
static corral_status kv_lookup(const gguf_file *f, const char *key, const gguf_kv **out,
                               corral_error *err) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0)
        return corral_error_set(err, CORRAL_NOT_FOUND, "%s: key '%s' not found", f->path,
                                key ? key : "(null)");
    *out = &f->kvs[i];
    return CORRAL_OK;
}

static corral_status kv_wrong_type(const gguf_file *f, const char *key, gguf_type have,
                                   const char *want, corral_error *err) {
    return corral_error_set(err, CORRAL_FORMAT, "%s: key '%s' is %s, expected %s", f->path, key,
                            gguf_types[have].name, want);
}

static corral_status kv_int(const gguf_file *f, const char *key, const char *want, int_value *v,
                            corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    if (!gguf_types[kv->type].is_int) return kv_wrong_type(f, key, kv->type, want, err);
    *v = int_load(f->base + kv->value_pos, kv->type);
    return CORRAL_OK;
}

static corral_status kv_does_not_fit(const gguf_file *f, const char *key, int_value v,
                                     const char *want, corral_error *err) {
    return corral_error_set(err, CORRAL_FORMAT,
                            "%s: key '%s': value %s%" PRIu64 " does not fit in %s", f->path, key,
                            v.neg ? "-" : "", v.mag, want);
}

corral_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, corral_error *err) {
    int_value v = {false, 0};
    corral_status st = kv_int(f, key, "an integer", &v, err);
    if (st != CORRAL_OK) return st;
    if (v.neg || v.mag > UINT32_MAX) return kv_does_not_fit(f, key, v, "uint32", err);
    *out = (uint32_t)v.mag;
    return CORRAL_OK;
}

corral_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, corral_error *err) {
    int_value v = {false, 0};
    corral_status st = kv_int(f, key, "an integer", &v, err);
    if (st != CORRAL_OK) return st;
    if (!int_fits_i32(v)) return kv_does_not_fit(f, key, v, "int32", err);
    *out = int_to_i32(v);
    return CORRAL_OK;
}

corral_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, corral_error *err) {
    int_value v = {false, 0};
    corral_status st = kv_int(f, key, "an integer", &v, err);
    if (st != CORRAL_OK) return st;
    if (v.neg) return kv_does_not_fit(f, key, v, "uint64", err);
    *out = v.mag;
    return CORRAL_OK;
}

corral_status gguf_get_f32(const gguf_file *f, const char *key, float *out, corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64) {
        return kv_wrong_type(f, key, kv->type, "float32 or float64", err);
    }
    double d = float_load(f->base + kv->value_pos, kv->type);
    if (!float_fits_f32(d)) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: key '%s': value %g does not fit in float32", f->path, key, d);
    }
    *out = (float)d;
    return CORRAL_OK;
}

corral_status gguf_get_bool(const gguf_file *f, const char *key, int *out, corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    if (kv->type != GGUF_TYPE_BOOL) return kv_wrong_type(f, key, kv->type, "bool", err);
    *out = f->base[kv->value_pos];
    return CORRAL_OK;
}

corral_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    if (kv->type != GGUF_TYPE_STRING) return kv_wrong_type(f, key, kv->type, "string", err);
    out->len = load_le(f->base + kv->value_pos, 8);
    out->data = (const char *)f->base + kv->value_pos + 8;
    return CORRAL_OK;
}

corral_status gguf_get_array(const gguf_file *f, const char *key, gguf_type *elem_type,
                             uint64_t *count, corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    if (kv->type != GGUF_TYPE_ARRAY) return kv_wrong_type(f, key, kv->type, "an array", err);
    *elem_type = kv->elem_type;
    *count = kv->count;
    return CORRAL_OK;
}

/* The array at key, checked to be numeric (floats, or integers and bools) and to hold exactly n
 * elements. */
static corral_status kv_numeric_array(const gguf_file *f, const char *key, uint64_t n, bool floats,
                                      const gguf_kv **out, corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_lookup(f, key, &kv, err);
    if (st != CORRAL_OK) return st;
    const char *want = floats ? "an array of float32 or float64" : "an array of integers";
    if (kv->type != GGUF_TYPE_ARRAY) return kv_wrong_type(f, key, kv->type, want, err);
    bool ok = floats ? kv->elem_type == GGUF_TYPE_FLOAT32 || kv->elem_type == GGUF_TYPE_FLOAT64
                     : gguf_types[kv->elem_type].is_int;
    if (!ok) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: key '%s' is an array of %s, expected %s",
                                f->path, key, gguf_types[kv->elem_type].name, want);
    }
    if (kv->count != n) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: key '%s' has %" PRIu64
                                " elements, the caller expects %" PRIu64,
                                f->path, key, kv->count, n);
    }
    *out = kv;
    return CORRAL_OK;
}

corral_status gguf_array_copy_f32(const gguf_file *f, const char *key, float *dst, uint64_t n,
                                  corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_numeric_array(f, key, n, true, &kv, err);
    if (st != CORRAL_OK) return st;
    uint32_t size = gguf_types[kv->elem_type].size;
    for (uint64_t i = 0; i < n; i++) {
        double d = float_load(f->base + kv->elems_pos + i * size, kv->elem_type);
        if (!float_fits_f32(d)) {
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s: key '%s': element %" PRIu64
                                    " (%g) does not fit in float32",
                                    f->path, key, i, d);
        }
        dst[i] = (float)d;
    }
    return CORRAL_OK;
}

corral_status gguf_array_copy_i32(const gguf_file *f, const char *key, int32_t *dst, uint64_t n,
                                  corral_error *err) {
    const gguf_kv *kv = NULL;
    corral_status st = kv_numeric_array(f, key, n, false, &kv, err);
    if (st != CORRAL_OK) return st;
    uint32_t size = gguf_types[kv->elem_type].size;
    for (uint64_t i = 0; i < n; i++) {
        int_value v = int_load(f->base + kv->elems_pos + i * size, kv->elem_type);
        if (!int_fits_i32(v)) {
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s: key '%s': element %" PRIu64 " (%s%" PRIu64
                                    ") does not fit in int32",
                                    f->path, key, i, v.neg ? "-" : "", v.mag);
        }
        dst[i] = int_to_i32(v);
    }
    return CORRAL_OK;
}

gguf_str gguf_array_str(const gguf_file *f, uint64_t kv_index, uint64_t i) {
    if (!f || kv_index >= f->n_kv) return (gguf_str){NULL, 0};
    const gguf_kv *kv = &f->kvs[kv_index];
    if (kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING || i >= kv->count) {
        return (gguf_str){NULL, 0};
    }
    uint64_t pos = kv->str_pos[i];
    return (gguf_str){(const char *)f->base + pos + 8, load_le(f->base + pos, 8)};
}

/* ---- rendering values for `corral inspect` --------------------------------------------------- */

/* Longest string shown, and how much of the line an array's items may take. */
#define GGUF_FORMAT_STRING_MAX   80
#define GGUF_FORMAT_ARRAY_BUDGET 80

typedef struct text_out {
    char *buf;
    size_t size;
    size_t len; /* bytes written, always < size */
} text_out;

__attribute__((format(printf, 2, 3))) static void out_printf(text_out *o, const char *fmt, ...) {
    if (o->len + 1 >= o->size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    o->len += (size_t)n < o->size - o->len ? (size_t)n : o->size - o->len - 1;
}

/* A string in double quotes with C escapes, cut (at a UTF-8 character boundary) after
 * GGUF_FORMAT_STRING_MAX bytes. */
static void out_quoted(text_out *o, const uint8_t *s, uint64_t len) {
    const uint64_t n = utf8_cut(s, (size_t)len, GGUF_FORMAT_STRING_MAX); /* the string is mapped */
    out_printf(o, "\"");
    for (uint64_t i = 0; i < n; i++) {
        char hex[LOG_ESCAPE_MAX];
        const char *esc = log_escape_byte(s[i], hex);
        if (esc) {
            out_printf(o, "%s", esc);
        } else {
            out_printf(o, "%c", (char)s[i]);
        }
    }
    out_printf(o, n < len ? "\"..." : "\"");
}

static void out_scalar(text_out *o, const uint8_t *p, gguf_type t) {
    if (t == GGUF_TYPE_BOOL) {
        out_printf(o, "%s", p[0] ? "true" : "false");
    } else if (t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64) {
        /* The shortest text that reads back as the same value: 1e-05, not 9.99999975e-06. */
        double d = float_load(p, t);
        bool f32 = t == GGUF_TYPE_FLOAT32;
        char text[40];
        for (int digits = f32 ? 6 : 15; digits <= (f32 ? 9 : 17); digits++) {
            snprintf(text, sizeof text, "%.*g", digits, d);
            double back = strtod(text, NULL);
            if (f32 ? float_fits_f32(back) && (float)back == (float)d : back == d) break;
        }
        out_printf(o, "%s", text);
    } else {
        int_value v = int_load(p, t);
        out_printf(o, "%s%" PRIu64, v.neg ? "-" : "", v.mag);
    }
}

/* Bytes taken by the (already validated) value of type t at p. */
static uint64_t value_extent(const uint8_t *p, gguf_type t) {
    if (gguf_types[t].size) return gguf_types[t].size;
    if (t == GGUF_TYPE_STRING) return 8 + load_le(p, 8);
    gguf_type elem = (gguf_type)load_le(p, 4);
    uint64_t count = load_le(p + 4, 8);
    if (gguf_types[elem].size) return GGUF_ARRAY_HEADER_BYTES + count * gguf_types[elem].size;
    uint64_t n = GGUF_ARRAY_HEADER_BYTES;
    for (uint64_t i = 0; i < count; i++) n += value_extent(p + n, elem);
    return n;
}

static void out_value(text_out *o, const uint8_t *p, gguf_type t) {
    if (gguf_types[t].size) {
        out_scalar(o, p, t);
        return;
    }
    if (t == GGUF_TYPE_STRING) {
        out_quoted(o, p + 8, load_le(p, 8));
        return;
    }
    gguf_type elem = (gguf_type)load_le(p, 4);
    uint64_t count = load_le(p + 4, 8);
    out_printf(o, "[%s x %" PRIu64 "]", gguf_types[elem].name, count);
    size_t start = o->len;
    const uint8_t *q = p + GGUF_ARRAY_HEADER_BYTES;
    uint64_t i = 0;
    for (; i < count && o->len - start < GGUF_FORMAT_ARRAY_BUDGET && o->len + 1 < o->size; i++) {
        out_printf(o, i == 0 ? " " : ", ");
        out_value(o, q, elem);
        q += value_extent(q, elem);
    }
    if (i < count) out_printf(o, "%s...", i == 0 ? " " : ", ");
}

size_t gguf_format_value(const gguf_file *f, uint64_t i, char *buf, size_t size) {
    if (!buf || size == 0) return 0;
    text_out o = {buf, size, 0};
    buf[0] = '\0';
    if (f && i < f->n_kv) out_value(&o, f->base + f->kvs[i].value_pos, f->kvs[i].type);
    return o.len;
}

/* ---- tensors --------------------------------------------------------------------------------- */

uint64_t gguf_tensor_count(const gguf_file *f) {
    return f->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    int64_t i = name_index_find(&f->tensor_index, name, strlen(name));
    return i < 0 ? NULL : &f->tensors[i];
}

int gguf_str_eq(gguf_str a, const char *s) {
    if (!s) return 0;
    size_t n = strlen(s);
    return a.len == n && (n == 0 || memcmp(a.data, s, n) == 0);
}

/* ---- writing --------------------------------------------------------------------------------- */

/* A growable byte buffer; after an allocation failure it stays failed and ignores writes. */
typedef struct bytebuf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
} bytebuf;

static void bb_put(bytebuf *b, const void *p, size_t n) {
    if (b->failed || n == 0) return;
    if (n > SIZE_MAX - b->len) {
        b->failed = true;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void bb_le(bytebuf *b, uint64_t v, unsigned n) {
    uint8_t bytes[8];
    for (unsigned i = 0; i < n; i++) bytes[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, bytes, n);
}

static void bb_str(bytebuf *b, const char *s, size_t len) {
    bb_le(b, len, 8);
    bb_put(b, s, len);
}

typedef struct builder_kv {
    char *key; /* NUL-terminated copy; key_len bytes (a copied key may hold NULs) */
    size_t key_len;
    gguf_type type;
    bytebuf value; /* the serialized value, as it goes after the type in the file */
} builder_kv;

typedef struct builder_tensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t size;
    const void *data; /* borrowed until gguf_builder_write returns */
    /* Or, when fill is set, produced by fill(user, ...) during gguf_builder_write. */
    gguf_tensor_fill_fn fill;
    void *user;
} builder_tensor;

struct gguf_builder {
    builder_kv *kvs;
    size_t n_kv, cap_kv;
    builder_tensor *tensors;
    size_t n_tensors, cap_tensors;
    const corral_progress *pace; /* gguf_builder_set_pace; NULL: none */
};

void gguf_builder_set_pace(gguf_builder *b, const corral_progress *pace) {
    if (b) b->pace = pace;
}

gguf_builder *gguf_builder_new(void) {
    return calloc(1, sizeof(gguf_builder));
}

void gguf_builder_destroy(gguf_builder **bp) {
    if (!bp || !*bp) return;
    gguf_builder *b = *bp;
    for (size_t i = 0; i < b->n_kv; i++) {
        free(b->kvs[i].key);
        free(b->kvs[i].value.data);
    }
    for (size_t i = 0; i < b->n_tensors; i++) free(b->tensors[i].name);
    free(b->kvs);
    free(b->tensors);
    free(b);
    *bp = NULL;
}

/* Grows an array of `elem` bytes so that it holds one more than n. */
static bool grow(void **items, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, c * elem);
    if (!p) return false;
    *items = p;
    *cap = c;
    return true;
}

/* Sets key to a serialized value, replacing an existing one. Takes ownership of value->data in
 * every case. */
static corral_status builder_put(gguf_builder *b, const char *key, size_t key_len, gguf_type type,
                                 bytebuf *value) {
    if (value->failed) {
        free(value->data);
        return CORRAL_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < b->n_kv; i++) {
        builder_kv *kv = &b->kvs[i];
        if (kv->key_len == key_len && memcmp(kv->key, key, key_len) == 0) {
            free(kv->value.data);
            kv->type = type;
            kv->value = *value;
            return CORRAL_OK;
        }
    }
    char *copy = malloc(key_len + 1);
    if (!copy || !grow((void **)&b->kvs, &b->cap_kv, b->n_kv, sizeof *b->kvs)) {
        free(copy);
        free(value->data);
        return CORRAL_OUT_OF_MEMORY;
    }
    memcpy(copy, key, key_len);
    copy[key_len] = '\0';
    b->kvs[b->n_kv++] = (builder_kv){copy, key_len, type, *value};
    return CORRAL_OK;
}

static corral_status builder_put_scalar(gguf_builder *b, const char *key, gguf_type type,
                                        uint64_t bits) {
    if (!b || !key) return CORRAL_INVALID_ARGUMENT;
    bytebuf v = {0};
    bb_le(&v, bits, gguf_types[type].size);
    return builder_put(b, key, strlen(key), type, &v);
}

corral_status gguf_builder_set_u32(gguf_builder *b, const char *key, uint32_t v) {
    return builder_put_scalar(b, key, GGUF_TYPE_UINT32, v);
}

corral_status gguf_builder_set_i32(gguf_builder *b, const char *key, int32_t v) {
    return builder_put_scalar(b, key, GGUF_TYPE_INT32, (uint32_t)v);
}

corral_status gguf_builder_set_u64(gguf_builder *b, const char *key, uint64_t v) {
    return builder_put_scalar(b, key, GGUF_TYPE_UINT64, v);
}

corral_status gguf_builder_set_f32(gguf_builder *b, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return builder_put_scalar(b, key, GGUF_TYPE_FLOAT32, bits);
}

corral_status gguf_builder_set_bool(gguf_builder *b, const char *key, int v) {
    return builder_put_scalar(b, key, GGUF_TYPE_BOOL, v != 0);
}

corral_status gguf_builder_set_str(gguf_builder *b, const char *key, const char *v) {
    if (!b || !key || !v) return CORRAL_INVALID_ARGUMENT;
    bytebuf buf = {0};
    bb_str(&buf, v, strlen(v));
    return builder_put(b, key, strlen(key), GGUF_TYPE_STRING, &buf);
}

corral_status gguf_builder_set_array(gguf_builder *b, const char *key, gguf_type type,
                                     const void *data, uint64_t count) {
    if (!b || !key || (unsigned)type >= GGUF_TYPE_COUNT || !gguf_types[type].size ||
        (count > 0 && !data)) {
        return CORRAL_INVALID_ARGUMENT;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(count, (uint64_t)gguf_types[type].size, &bytes) ||
        bytes > SIZE_MAX) {
        return CORRAL_INVALID_ARGUMENT;
    }
    /* The reader rejects bool bytes other than 0 and 1, so the writer never produces them. */
    if (type == GGUF_TYPE_BOOL) {
        for (uint64_t i = 0; i < count; i++) {
            if (((const uint8_t *)data)[i] > 1) return CORRAL_INVALID_ARGUMENT;
        }
    }
    bytebuf buf = {0};
    bb_le(&buf, type, 4);
    bb_le(&buf, count, 8);
    /* Elements are taken in host order and written little-endian. */
    uint32_t size = gguf_types[type].size;
    for (uint64_t i = 0; i < count && !buf.failed; i++) {
        uint64_t v = 0;
        const uint8_t *p = (const uint8_t *)data + i * size;
        switch (size) {
            case 1:
                v = p[0];
                break;
            case 2: {
                uint16_t x;
                memcpy(&x, p, 2);
                v = x;
                break;
            }
            case 4: {
                uint32_t x;
                memcpy(&x, p, 4);
                v = x;
                break;
            }
            default:
                memcpy(&v, p, 8);
                break;
        }
        bb_le(&buf, v, size);
    }
    return builder_put(b, key, strlen(key), GGUF_TYPE_ARRAY, &buf);
}

corral_status gguf_builder_set_str_array(gguf_builder *b, const char *key, const char *const *strs,
                                         uint64_t count) {
    if (!b || !key || (count > 0 && !strs)) return CORRAL_INVALID_ARGUMENT;
    for (uint64_t i = 0; i < count; i++) {
        if (!strs[i]) return CORRAL_INVALID_ARGUMENT;
    }
    bytebuf buf = {0};
    bb_le(&buf, GGUF_TYPE_STRING, 4);
    bb_le(&buf, count, 8);
    for (uint64_t i = 0; i < count && !buf.failed; i++) bb_str(&buf, strs[i], strlen(strs[i]));
    return builder_put(b, key, strlen(key), GGUF_TYPE_ARRAY, &buf);
}

corral_status gguf_builder_copy_kv(gguf_builder *b, const gguf_file *src, uint64_t i) {
    if (!b || !src || i >= src->n_kv) return CORRAL_INVALID_ARGUMENT;
    const gguf_kv *kv = &src->kvs[i];
    if (kv->value_size > SIZE_MAX) return CORRAL_OUT_OF_MEMORY;
    bytebuf buf = {0};
    bb_put(&buf, src->base + kv->value_pos, (size_t)kv->value_size);
    return builder_put(b, kv->key.data, (size_t)kv->key.len, kv->type, &buf);
}

/* Checks and records one tensor; its bytes come from data or, when fill is set, from fill. */
static corral_status builder_add(gguf_builder *b, const char *name, uint32_t type, uint32_t n_dims,
                                 const int64_t *ne, const void *data, gguf_tensor_fill_fn fill,
                                 void *user, corral_error *err) {
    if (!b || !name || !ne) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "gguf_builder_add_tensor: NULL argument");
    }
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    if (!tt) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor '%s': unknown tensor type id %" PRIu32, name, type);
    }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor '%s': n_dims %" PRIu32 " is out of range 1..%d", name,
                                n_dims, GGUF_MAX_DIMS);
    }
    builder_tensor t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill, .user = user};
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "tensor '%s': dimension ne[%" PRIu32 "] is negative", name, d);
        }
    }
    if (t.ne[0] % tt->block_size != 0) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor '%s': ne[0] = %" PRId64
                                " is not a multiple of the block size %" PRId64 " of type %s",
                                name, t.ne[0], tt->block_size, tt->name);
    }
    uint64_t bytes = (uint64_t)(t.ne[0] / tt->block_size);
    int64_t elements = 1;
    bool overflow = __builtin_mul_overflow(bytes, (uint64_t)tt->type_size, &bytes);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        overflow |= __builtin_mul_overflow(elements, t.ne[d], &elements);
        if (d > 0) overflow |= __builtin_mul_overflow(bytes, (uint64_t)t.ne[d], &bytes);
    }
    if (overflow || bytes > SIZE_MAX) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tensor '%s': size overflows", name);
    }
    if (bytes > 0 && !data && !fill) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tensor '%s': data is NULL", name);
    }
    t.size = bytes;
    for (size_t i = 0; i < b->n_tensors; i++) {
        if (strcmp(b->tensors[i].name, name) == 0) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "duplicate tensor name '%s'",
                                    name);
        }
    }
    t.name = strdup(name);
    if (!t.name || !grow((void **)&b->tensors, &b->cap_tensors, b->n_tensors, sizeof t)) {
        free(t.name);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
    }
    b->tensors[b->n_tensors++] = t;
    return CORRAL_OK;
}

corral_status gguf_builder_add_tensor(gguf_builder *b, const char *name, uint32_t type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      corral_error *err) {
    return builder_add(b, name, type, n_dims, ne, data, NULL, NULL, err);
}

corral_status gguf_builder_add_tensor_fill(gguf_builder *b, const char *name, uint32_t type,
                                           uint32_t n_dims, const int64_t *ne,
                                           gguf_tensor_fill_fn fill, void *user,
                                           corral_error *err) {
    if (!fill) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "gguf_builder_add_tensor_fill: tensor '%s': NULL fill function",
                                name ? name : "?");
    }
    return builder_add(b, name, type, n_dims, ne, NULL, fill, user, err);
}

/* Writes all n bytes, retrying short writes and interruptions. */
static bool write_all(int fd, const void *p, uint64_t n) {
    const uint8_t *q = p;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t w = write(fd, q, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        q += w;
        n -= (uint64_t)w;
    }
    return true;
}

/* write_all in pieces of BUILDER_PACE_BYTES with the builder's pause point between them. */
#define BUILDER_PACE_BYTES (8u << 20)
static bool write_paced(const gguf_builder *b, int fd, const void *p, uint64_t n) {
    const uint8_t *q = p;
    while (n > BUILDER_PACE_BYTES) {
        if (!write_all(fd, q, BUILDER_PACE_BYTES)) return false;
        q += BUILDER_PACE_BYTES;
        n -= BUILDER_PACE_BYTES;
        corral_progress_pace(b->pace);
    }
    return write_all(fd, q, n);
}

static bool write_zeros(int fd, uint64_t n) {
    static const uint8_t zeros[4096];
    while (n > 0) {
        uint64_t chunk = n < sizeof zeros ? n : sizeof zeros;
        if (!write_all(fd, zeros, chunk)) return false;
        n -= chunk;
    }
    return true;
}

static uint64_t pad_to(uint64_t n, uint32_t alignment) {
    return (alignment - n % alignment) % alignment;
}

/* The alignment the file will use: general.alignment when set (a power-of-two uint32). */
static corral_status builder_alignment(const gguf_builder *b, uint32_t *out, corral_error *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < b->n_kv; i++) {
        const builder_kv *kv = &b->kvs[i];
        if (kv->key_len != strlen("general.alignment") || strcmp(kv->key, "general.alignment")) {
            continue;
        }
        uint32_t a = kv->type == GGUF_TYPE_UINT32 ? (uint32_t)load_le(kv->value.data, 4) : 0;
        if (a == 0 || (a & (a - 1)) != 0) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "general.alignment must be a uint32 power of two");
        }
        *out = a;
    }
    return CORRAL_OK;
}

/* Header, metadata and tensor infos (the padding after them is written by the caller). The data
 * offsets are laid out in order, each tensor padded to the alignment (as ggml writes them). */
static corral_status builder_header(const gguf_builder *b, uint32_t alignment, bytebuf *h,
                                    corral_error *err) {
    bb_put(h, "GGUF", 4);
    bb_le(h, GGUF_VERSION_WRITTEN, 4);
    bb_le(h, b->n_tensors, 8);
    bb_le(h, b->n_kv, 8);
    for (size_t i = 0; i < b->n_kv; i++) {
        const builder_kv *kv = &b->kvs[i];
        bb_str(h, kv->key, kv->key_len);
        bb_le(h, kv->type, 4);
        bb_put(h, kv->value.data, kv->value.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < b->n_tensors; i++) {
        const builder_tensor *t = &b->tensors[i];
        bb_str(h, t->name, strlen(t->name));
        bb_le(h, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) bb_le(h, (uint64_t)t->ne[d], 8);
        bb_le(h, t->type, 4);
        bb_le(h, offset, 8);
        uint64_t padded;
        if (__builtin_add_overflow(t->size, pad_to(t->size, alignment), &padded) ||
            __builtin_add_overflow(offset, padded, &offset)) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tensor data exceeds 2^64 bytes");
        }
    }
    if (h->failed) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    return CORRAL_OK;
}

/* fsync the directory holding path, so that the rename itself survives a crash. */
static void fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* best effort: the file itself was already synced */
        close(fd);
    }
    free(dir);
}

corral_status gguf_builder_write(gguf_builder *b, const char *path, corral_error *err) {
    if (!b || !path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "gguf_builder_write: NULL argument");
    }
    uint32_t alignment;
    corral_status st = builder_alignment(b, &alignment, err);
    if (st != CORRAL_OK) return corral_error_prefix(err, "%s", path);
    bytebuf header = {0};
    st = builder_header(b, alignment, &header, err);
    if (st != CORRAL_OK) {
        free(header.data);
        return corral_error_prefix(err, "%s", path);
    }
    /* One buffer, the size of the largest filled tensor, serves every fill in turn. */
    uint64_t fill_max = 0;
    for (size_t i = 0; i < b->n_tensors; i++) {
        if (b->tensors[i].fill && b->tensors[i].size > fill_max) fill_max = b->tensors[i].size;
    }
    void *fill_buf = NULL;
    if (fill_max > 0 && (fill_max > SIZE_MAX || !(fill_buf = malloc((size_t)fill_max)))) {
        free(header.data);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY,
                                "%s: no memory for a %" PRIu64 "-byte tensor buffer", path,
                                fill_max);
    }

    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) {
        free(header.data);
        free(fill_buf);
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(header.data);
        free(fill_buf);
        return corral_error_set(err, CORRAL_IO, "%s: cannot create: %s", tmp, strerror(e));
    }
    /* Files without tensors end right after the metadata, as llama.cpp's vocab files do. */
    bool ok = write_all(fd, header.data, header.len) &&
              write_zeros(fd, b->n_tensors ? pad_to(header.len, alignment) : 0);
    free(header.data);
    corral_status fill_st = CORRAL_OK;
    for (size_t i = 0; i < b->n_tensors && ok; i++) {
        const builder_tensor *t = &b->tensors[i];
        const void *data = t->data;
        corral_progress_pace(b->pace);
        if (t->fill && t->size > 0) {
            fill_st = t->fill(t->user, t->name, fill_buf, t->size, err);
            if (fill_st != CORRAL_OK) break;
            data = fill_buf;
        }
        ok = write_paced(b, fd, data, t->size) && write_zeros(fd, pad_to(t->size, alignment));
    }
    free(fill_buf);
    if (fill_st != CORRAL_OK) {
        close(fd);
        unlink(tmp);
        corral_error_prefix(err, "%s", path);
        return fill_st;
    }
    int e = errno;
    if (ok && fsync(fd) != 0) {
        ok = false;
        e = errno;
    }
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        return corral_error_set(err, CORRAL_IO, "%s: cannot write: %s", path, strerror(e));
    }
    fsync_parent_dir(path);
    return CORRAL_OK;
}
