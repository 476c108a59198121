/*
 * imatrix.c — importance matrices: computing them over calibration text, and llama.cpp's file
 * formats (contracts and the format in imatrix.h).
 *
 * Computing. A runner's forward passes are watched (model_runner_set_observer): before every
 * matrix product the observer gets the weight (by its bytes in the model file) and the product's
 * input rows, finds the weight's entry (a binary search over the entries sorted by data address)
 * and adds each row's squares to the entry's sums, in double, and the rows to its count. The
 * sums stay in double until the file is written (llama-imatrix sums in float; over long texts
 * double loses less). The observer runs on the thread that runs the pass, one product at a time,
 * so the sums need no locking.
 *
 * Reading. The GGUF reader (gguf.h) has already checked every tensor against the file; here
 * each ".in_sum2" is paired with its ".counts" (tensor names sorted, so pairs are neighbours), the
 * two sizes must divide, and every value must be finite and non-negative. The older binary format
 * is parsed from a buffer with every length checked against what is left.
 */
#include "corral/imatrix.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corral/gguf.h"
#include "corral/tensor.h"
#include "corral/tokenizer.h"

#define KEY_TYPE         "general.type"
#define KEY_DATASETS     "imatrix.datasets"
#define KEY_CHUNK_COUNT  "imatrix.chunk_count"
#define KEY_CHUNK_SIZE   "imatrix.chunk_size"
#define SUFFIX_SUMS      ".in_sum2"
#define SUFFIX_COUNTS    ".counts"
/* The older binary format is read whole; no real one comes near this. */
#define LEGACY_MAX_BYTES (1ull << 31)

typedef struct imatrix_entry {
    char name[IMATRIX_MAX_NAME + 1];
    const void *weight; /* imatrix_compute: the weight's bytes in the model file */
    uint64_t n_values;  /* n_in * n_mat */
    uint32_t n_mat;
    double *sums;      /* n_values; NULL until the first product (compute) */
    int64_t *counts;   /* n_mat */
    float *importance; /* n_values, derived by finish() */
} imatrix_entry;

struct imatrix {
    imatrix_entry *e;
    uint32_t n, cap;
    char **datasets;
    uint32_t n_datasets;
    uint32_t chunk_count, chunk_size;
    int legacy; /* sums are value * ncall (the .dat format) */
};

/* ---- the collection ---------------------------------------------------------------------------
 */

imatrix *imatrix_new(void) {
    return calloc(1, sizeof(imatrix));
}

static void entry_free(imatrix_entry *e) {
    free(e->sums);
    free(e->counts);
    free(e->importance);
}

void imatrix_destroy(imatrix **pim) {
    if (!pim || !*pim) return;
    imatrix *im = *pim;
    for (uint32_t i = 0; i < im->n; i++) entry_free(&im->e[i]);
    free(im->e);
    for (uint32_t i = 0; i < im->n_datasets; i++) free(im->datasets[i]);
    free(im->datasets);
    free(im);
    *pim = NULL;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const imatrix_entry *)a)->name, ((const imatrix_entry *)b)->name);
}

/* A new zeroed entry at the end (its arrays allocated), or NULL when out of memory. */
static imatrix_entry *entry_add(imatrix *im, const char *name, uint64_t n_values, uint32_t n_mat) {
    if (im->n == im->cap) {
        uint32_t cap = im->cap ? 2 * im->cap : 16;
        imatrix_entry *e = realloc(im->e, cap * sizeof *e);
        if (!e) return NULL;
        im->e = e;
        im->cap = cap;
    }
    imatrix_entry *e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->n_values = n_values;
    e->n_mat = n_mat;
    e->sums = calloc(n_values, sizeof *e->sums);
    e->counts = calloc(n_mat, sizeof *e->counts);
    if (!e->sums || !e->counts) {
        entry_free(e);
        return NULL;
    }
    im->n++;
    return e;
}

/* Sort by name, refuse a name given twice (a file's: `path` names it in the message), and derive
 * every entry's importance (see imatrix.h). */
static corral_status finish(imatrix *im, const char *path, corral_error *err) {
    qsort(im->e, im->n, sizeof *im->e, by_name);
    for (uint32_t i = 1; i < im->n; i++)
        if (strcmp(im->e[i - 1].name, im->e[i].name) == 0)
            return corral_error_set(err, CORRAL_FORMAT, "%s: entry %s appears twice",
                                    path ? path : "importance matrix", im->e[i].name);
    for (uint32_t i = 0; i < im->n; i++) {
        imatrix_entry *e = &im->e[i];
        free(e->importance);
        e->importance = malloc(e->n_values * sizeof *e->importance);
        if (!e->importance) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        const uint64_t per = e->n_values / e->n_mat;
        for (uint64_t v = 0; v < e->n_values; v++) {
            const int64_t count = e->counts[im->legacy ? 0 : v / per];
            if (im->legacy)
                e->importance[v] =
                    count > 0 ? (float)(e->sums[v] / (double)count) : (float)e->sums[v];
            else
                e->importance[v] = count > 0 ? (float)(e->sums[v] / (double)count) : 1.0f;
        }
    }
    return CORRAL_OK;
}

corral_status imatrix_set(imatrix *im, const char *tensor, const float *importance, uint64_t n,
                          uint64_t tokens, corral_error *err) {
    if (!im || !tensor || !importance || n == 0 || tokens == 0 || tokens > INT64_MAX ||
        strlen(tensor) > IMATRIX_MAX_NAME)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "imatrix_set: bad argument");
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(importance[i]) || importance[i] < 0)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "imatrix entry %s: value %" PRIu64 " is %g", tensor, i,
                                    (double)importance[i]);
    for (uint32_t i = 0; i < im->n; i++) {
        if (strcmp(im->e[i].name, tensor) == 0) {
            entry_free(&im->e[i]);
            im->e[i] = im->e[--im->n];
            break;
        }
    }
    imatrix_entry *e = entry_add(im, tensor, n, 1);
    if (!e) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (uint64_t i = 0; i < n; i++) e->sums[i] = (double)importance[i] * (double)tokens;
    e->counts[0] = (int64_t)tokens;
    return finish(im, NULL, err);
}

uint32_t imatrix_n_entries(const imatrix *im) {
    return im ? im->n : 0;
}

const char *imatrix_entry_name(const imatrix *im, uint32_t i) {
    return im && i < im->n ? im->e[i].name : NULL;
}

static const imatrix_entry *entry_find(const imatrix *im, const char *tensor) {
    if (!im || !tensor || im->n == 0) return NULL;
    imatrix_entry key;
    snprintf(key.name, sizeof key.name, "%s", tensor);
    if (strlen(tensor) > IMATRIX_MAX_NAME) return NULL;
    return bsearch(&key, im->e, im->n, sizeof *im->e, by_name);
}

const float *imatrix_find(const imatrix *im, const char *tensor, uint64_t *n) {
    const imatrix_entry *e = entry_find(im, tensor);
    if (!e) return NULL;
    if (n) *n = e->n_values;
    return e->importance;
}

uint64_t imatrix_entry_tokens(const imatrix *im, const char *tensor) {
    const imatrix_entry *e = entry_find(im, tensor);
    int64_t most = 0;
    for (uint32_t j = 0; e && j < (im->legacy ? 1 : e->n_mat); j++)
        if (e->counts[j] > most) most = e->counts[j];
    return (uint64_t)most;
}

uint32_t imatrix_chunk_count(const imatrix *im) {
    return im ? im->chunk_count : 0;
}

uint32_t imatrix_chunk_size(const imatrix *im) {
    return im ? im->chunk_size : 0;
}

uint32_t imatrix_n_datasets(const imatrix *im) {
    return im ? im->n_datasets : 0;
}

const char *imatrix_dataset(const imatrix *im, uint32_t i) {
    return im && i < im->n_datasets ? im->datasets[i] : NULL;
}

static corral_status add_dataset(imatrix *im, const char *s, size_t len) {
    if (im->n_datasets >= IMATRIX_MAX_DATASETS) return CORRAL_OK; /* the rest are dropped */
    char **d = realloc(im->datasets, (im->n_datasets + 1) * sizeof *d);
    if (!d) return CORRAL_OUT_OF_MEMORY;
    im->datasets = d;
    if (!(d[im->n_datasets] = malloc(len + 1))) return CORRAL_OUT_OF_MEMORY;
    memcpy(d[im->n_datasets], s, len);
    d[im->n_datasets][len] = '\0';
    im->n_datasets++;
    return CORRAL_OK;
}

/* ---- reading: GGUF ----------------------------------------------------------------------------
 */

typedef struct named_tensor {
    char base[IMATRIX_MAX_NAME + 1]; /* the name without its suffix */
    int is_counts;
    const gguf_tensor *t;
} named_tensor;

static int by_base(const void *a, const void *b) {
    const named_tensor *x = a, *y = b;
    int c = strcmp(x->base, y->base);
    return c ? c : x->is_counts - y->is_counts;
}

static uint64_t n_elements(const gguf_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
    return n;
}

/* Splits a tensor name into base and suffix; 0 when it has neither suffix (ignored, as
 * llama.cpp ignores it). */
static int split_name(gguf_str name, named_tensor *out) {
    static const struct {
        const char *suffix;
        int is_counts;
    } kinds[] = {{SUFFIX_SUMS, 0}, {SUFFIX_COUNTS, 1}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t sl = strlen(kinds[k].suffix);
        if (name.len <= sl || name.len - sl > IMATRIX_MAX_NAME) continue;
        if (memcmp(name.data + name.len - sl, kinds[k].suffix, sl) != 0) continue;
        memcpy(out->base, name.data, name.len - sl);
        out->base[name.len - sl] = '\0';
        out->is_counts = kinds[k].is_counts;
        return 1;
    }
    return 0;
}

/* Reads the entries of an open GGUF file (path names it in messages); destroys f. */
static imatrix *load_gguf(gguf_file *f, const char *path, corral_error *err) {
    if (!f) return NULL;
    imatrix *im = imatrix_new();
    const uint64_t n_tensors = gguf_tensor_count(f);
    named_tensor *nt = NULL;
    corral_status st = CORRAL_OK;
    if (!im) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    } else if (n_tensors > 2ull * IMATRIX_MAX_ENTRIES) {
        st = corral_error_set(err, CORRAL_FORMAT, "%s: %" PRIu64 " tensors, more than %u entries",
                              path, n_tensors, IMATRIX_MAX_ENTRIES);
    } else if (!(nt = calloc(n_tensors ? n_tensors : 1, sizeof *nt))) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    uint64_t n_named = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n_tensors; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (!split_name(t->name, &nt[n_named])) continue;
        if (t->type != TENSOR_TYPE_F32) {
            st = corral_error_set(err, CORRAL_FORMAT, "%s: tensor %.*s is %s, not F32", path,
                                  (int)t->name.len, t->name.data, tensor_type_name(t->type));
            break;
        }
        nt[n_named++].t = t;
    }
    if (st == CORRAL_OK) qsort(nt, n_named, sizeof *nt, by_base);
    for (uint64_t i = 0; st == CORRAL_OK && i < n_named; i += 2) {
        if (i + 1 >= n_named || strcmp(nt[i].base, nt[i + 1].base) != 0 || nt[i].is_counts ||
            !nt[i + 1].is_counts) {
            st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %s lacks its %s tensor", path,
                                  nt[i].base, nt[i].is_counts ? SUFFIX_SUMS : SUFFIX_COUNTS);
            break;
        }
        const uint64_t n_values = n_elements(nt[i].t), n_mat = n_elements(nt[i + 1].t);
        if (n_values == 0 || n_mat == 0 || n_mat > UINT32_MAX || n_values % n_mat != 0) {
            st = corral_error_set(err, CORRAL_FORMAT,
                                  "%s: entry %s has %" PRIu64 " sums for %" PRIu64 " counts", path,
                                  nt[i].base, n_values, n_mat);
            break;
        }
        imatrix_entry *e = entry_add(im, nt[i].base, n_values, (uint32_t)n_mat);
        if (!e) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
            break;
        }
        const float *sums = nt[i].t->data, *counts = nt[i + 1].t->data;
        for (uint64_t v = 0; v < n_values && st == CORRAL_OK; v++) {
            float x;
            memcpy(&x, sums + v, sizeof x);
            if (!isfinite(x) || x < 0)
                st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %s: sum %" PRIu64 " is %g",
                                      path, nt[i].base, v, (double)x);
            e->sums[v] = x;
        }
        for (uint64_t j = 0; j < n_mat && st == CORRAL_OK; j++) {
            float c;
            memcpy(&c, counts + j, sizeof c);
            if (!isfinite(c) || c < 0 || c > 9e18f)
                st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %s: count %" PRIu64 " is %g",
                                      path, nt[i].base, j, (double)c);
            e->counts[j] = (int64_t)llroundf(c);
        }
    }
    if (st == CORRAL_OK && im->n == 0)
        st = corral_error_set(err, CORRAL_FORMAT, "%s: no importance matrix entries", path);
    if (st == CORRAL_OK) {
        uint32_t u;
        if (gguf_get_u32(f, KEY_CHUNK_COUNT, &u, NULL) == CORRAL_OK) im->chunk_count = u;
        if (gguf_get_u32(f, KEY_CHUNK_SIZE, &u, NULL) == CORRAL_OK) im->chunk_size = u;
        int64_t k = gguf_find_key(f, KEY_DATASETS);
        gguf_type et;
        uint64_t count;
        if (k >= 0 && gguf_get_array(f, KEY_DATASETS, &et, &count, NULL) == CORRAL_OK &&
            et == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < count && st == CORRAL_OK; i++) {
                gguf_str s = gguf_array_str(f, (uint64_t)k, i);
                if (s.data && add_dataset(im, s.data, (size_t)s.len) != CORRAL_OK)
                    st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
            }
        }
    }
    if (st == CORRAL_OK) st = finish(im, path, err);
    free(nt);
    gguf_destroy(&f);
    if (st != CORRAL_OK) imatrix_destroy(&im);
    return im;
}

/* ---- reading: the older binary format ---------------------------------------------------------
 */

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static int read_i32(reader *r, int32_t *out) {
    if (r->left < 4) return -1;
    memcpy(out, r->p, 4);
    r->p += 4;
    r->left -= 4;
    return 0;
}

static imatrix *load_legacy(const char *path, const uint8_t *buf, size_t size, corral_error *err) {
    reader r = {buf, size};
    imatrix *im = imatrix_new();
    int32_t n_entries = 0;
    if (!im) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    im->legacy = 1;
    corral_status st = CORRAL_OK;
    if (read_i32(&r, &n_entries) != 0 || n_entries < 1 || n_entries > IMATRIX_MAX_ENTRIES)
        st = corral_error_set(err, CORRAL_FORMAT,
                              "%s: not an importance matrix (neither GGUF nor a valid entry count)",
                              path);
    for (int32_t i = 0; st == CORRAL_OK && i < n_entries; i++) {
        int32_t len = 0, ncall = 0, nval = 0;
        char name[IMATRIX_MAX_NAME + 1];
        if (read_i32(&r, &len) != 0 || len < 1 || len > IMATRIX_MAX_NAME || (size_t)len > r.left) {
            st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %d: bad name length", path, i);
            break;
        }
        memcpy(name, r.p, (size_t)len);
        name[len] = '\0';
        r.p += len;
        r.left -= (size_t)len;
        if (read_i32(&r, &ncall) != 0 || read_i32(&r, &nval) != 0 || ncall < 0 || nval < 1 ||
            (size_t)nval > r.left / sizeof(float)) {
            st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %s: bad counts", path, name);
            break;
        }
        imatrix_entry *e = entry_add(im, name, (uint64_t)nval, 1);
        if (!e) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
            break;
        }
        e->counts[0] = ncall;
        for (int32_t v = 0; v < nval; v++) {
            float x;
            memcpy(&x, r.p + 4 * (size_t)v, sizeof x);
            if (!isfinite(x) || x < 0) {
                st = corral_error_set(err, CORRAL_FORMAT, "%s: entry %s: value %d is %g", path,
                                      name, v, (double)x);
                break;
            }
            e->sums[v] = x;
        }
        r.p += 4 * (size_t)nval;
        r.left -= 4 * (size_t)nval;
    }
    /* Optional trailer: the chunk count and the dataset's name. */
    int32_t chunks = 0, len = 0;
    if (st == CORRAL_OK && read_i32(&r, &chunks) == 0) {
        im->chunk_count = chunks > 0 ? (uint32_t)chunks : 0;
        if (read_i32(&r, &len) == 0 && len > 0 && (size_t)len <= r.left &&
            add_dataset(im, (const char *)r.p, (size_t)len) != CORRAL_OK)
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    if (st == CORRAL_OK) st = finish(im, path, err);
    if (st != CORRAL_OK) imatrix_destroy(&im);
    return im;
}

/* Legacy files are read whole into memory; this checks the size first. */
static int legacy_size_ok(uint64_t size) {
    return size <= LEGACY_MAX_BYTES;
}

imatrix *imatrix_load(const char *path, corral_error *err) {
    if (!path) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "imatrix_load: no path");
        return NULL;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s: %s", path,
                         strerror(e));
        return NULL;
    }
    char magic[4] = {0};
    const size_t got = fread(magic, 1, sizeof magic, fp);
    if (got == sizeof magic && memcmp(magic, "GGUF", 4) == 0) {
        fclose(fp);
        return load_gguf(gguf_open(path, err), path, err);
    }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) ||
        !legacy_size_ok((uint64_t)sb.st_size)) {
        fclose(fp);
        corral_error_set(err, CORRAL_FORMAT, "%s: not an importance matrix file", path);
        return NULL;
    }
    uint8_t *buf = malloc((size_t)sb.st_size + 1);
    imatrix *im = NULL;
    if (!buf) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    } else if (fseek(fp, 0, SEEK_SET) != 0 ||
               fread(buf, 1, (size_t)sb.st_size, fp) != (size_t)sb.st_size) {
        corral_error_set(err, CORRAL_IO, "%s: cannot read", path);
    } else {
        im = load_legacy(path, buf, (size_t)sb.st_size, err);
    }
    free(buf);
    fclose(fp);
    return im;
}

imatrix *imatrix_load_buffer(const void *data, size_t size, const char *name, corral_error *err) {
    if (!data && size > 0) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "imatrix_load_buffer: no data");
        return NULL;
    }
    if (!name) name = "(buffer)";
    if (size >= 4 && memcmp(data, "GGUF", 4) == 0)
        return load_gguf(gguf_open_buffer(data, size, name, err), name, err);
    if (!legacy_size_ok(size)) {
        corral_error_set(err, CORRAL_FORMAT, "%s: not an importance matrix file", name);
        return NULL;
    }
    return load_legacy(name, data, size, err);
}

/* ---- writing ----------------------------------------------------------------------------------
 */

corral_status imatrix_save(const imatrix *im, const char *path, corral_error *err) {
    if (!im || !path || im->n == 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "imatrix_save: nothing to write to %s", path ? path : "(null)");
    gguf_builder *b = gguf_builder_new();
    float **bufs = calloc(im->n, sizeof *bufs);
    corral_status st = CORRAL_OK;
    if (!b || !bufs) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st == CORRAL_OK &&
        (gguf_builder_set_str(b, KEY_TYPE, "imatrix") != CORRAL_OK ||
         gguf_builder_set_str_array(b, KEY_DATASETS, (const char *const *)im->datasets,
                                    im->n_datasets) != CORRAL_OK ||
         gguf_builder_set_u32(b, KEY_CHUNK_COUNT, im->chunk_count) != CORRAL_OK ||
         gguf_builder_set_u32(b, KEY_CHUNK_SIZE, im->chunk_size) != CORRAL_OK))
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    /* Entries are kept sorted by name (finish), the order llama-imatrix writes. */
    for (uint32_t i = 0; st == CORRAL_OK && i < im->n; i++) {
        const imatrix_entry *e = &im->e[i];
        bufs[i] = malloc((e->n_values + e->n_mat) * sizeof(float));
        if (!bufs[i]) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
            break;
        }
        float *sums = bufs[i], *counts = bufs[i] + e->n_values;
        /* A legacy entry holds mean * ncall with the count ncall: the same sums over counts. */
        for (uint64_t v = 0; v < e->n_values; v++) sums[v] = (float)e->sums[v];
        for (uint32_t j = 0; j < e->n_mat; j++) counts[j] = (float)e->counts[im->legacy ? 0 : j];
        char name[IMATRIX_MAX_NAME + 16];
        const int64_t ne_sums[2] = {(int64_t)(e->n_values / e->n_mat), e->n_mat};
        const int64_t ne_counts[2] = {1, e->n_mat};
        const uint32_t dims = e->n_mat > 1 ? 2 : 1;
        snprintf(name, sizeof name, "%s%s", e->name, SUFFIX_SUMS);
        st = gguf_builder_add_tensor(b, name, TENSOR_TYPE_F32, dims, ne_sums, sums, err);
        snprintf(name, sizeof name, "%s%s", e->name, SUFFIX_COUNTS);
        if (st == CORRAL_OK)
            st = gguf_builder_add_tensor(b, name, TENSOR_TYPE_F32, dims, ne_counts, counts, err);
    }
    if (st == CORRAL_OK) st = gguf_builder_write(b, path, err);
    for (uint32_t i = 0; bufs && i < im->n; i++) free(bufs[i]);
    free(bufs);
    gguf_builder_destroy(&b);
    return st;
}

/* ---- computing --------------------------------------------------------------------------------
 */

typedef struct collect_ctx {
    imatrix *im;
    imatrix_entry **by_weight; /* the entries sorted by weight address */
    uint32_t n;
} collect_ctx;

static int by_weight(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)(*(imatrix_entry *const *)a)->weight;
    const uintptr_t y = (uintptr_t)(*(imatrix_entry *const *)b)->weight;
    return x < y ? -1 : x > y;
}

static void observe(void *user, const void *weight, const float *x, int64_t n_tok, int64_t n_in) {
    collect_ctx *c = user;
    uint32_t lo = 0, hi = c->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)c->by_weight[mid]->weight < (uintptr_t)weight)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == c->n || c->by_weight[lo]->weight != weight) return; /* not collected */
    imatrix_entry *e = c->by_weight[lo];
    if ((uint64_t)n_in != e->n_values) return; /* a 3-D (expert) weight: not run by corral */
    for (int64_t t = 0; t < n_tok; t++) {
        const float *row = x + t * n_in;
        for (int64_t j = 0; j < n_in; j++) e->sums[j] += (double)(row[j] * row[j]);
    }
    e->counts[0] += n_tok;
}

imatrix *imatrix_compute(const model *m, threadpool *pool, const int32_t *tokens, size_t n_tokens,
                         const imatrix_params *params, corral_error *err) {
    const imatrix_params defaults = {0};
    const imatrix_params *p = params ? params : &defaults;
    const model_hparams *hp = model_get_hparams(m);
    uint32_t n_ctx = p->n_ctx ? p->n_ctx : (hp->n_ctx_train < 512 ? hp->n_ctx_train : 512);
    if (n_ctx < 16 || n_ctx > hp->n_ctx_train) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                         "context %u is outside 16..%u (the model's context)", n_ctx,
                         hp->n_ctx_train);
        return NULL;
    }
    size_t n_chunks = n_tokens / n_ctx;
    if (n_chunks < 2) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                         "%zu tokens make %zu chunk(s) of %u; an importance matrix needs at least "
                         "2 (use a longer text or a smaller context)",
                         n_tokens, n_chunks, n_ctx);
        return NULL;
    }
    if (p->max_chunks && n_chunks > p->max_chunks) n_chunks = p->max_chunks;

    imatrix *im = imatrix_new();
    collect_ctx c = {.im = im};
    const gguf_file *f = model_get_gguf(m);
    corral_status st = im ? CORRAL_OK : CORRAL_OUT_OF_MEMORY;
    /* An entry for every matrix llama-imatrix would collect. */
    for (uint64_t i = 0; st == CORRAL_OK && i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const int is_blk = t->name.len > 4 && memcmp(t->name.data, "blk.", 4) == 0;
        const int is_out = p->process_output && gguf_str_eq(t->name, "output.weight");
        if ((!is_blk && !is_out) || t->n_dims != 2 || t->name.len > IMATRIX_MAX_NAME) continue;
        char name[IMATRIX_MAX_NAME + 1];
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = '\0';
        imatrix_entry *e = entry_add(im, name, (uint64_t)t->ne[0], 1);
        if (!e)
            st = CORRAL_OUT_OF_MEMORY;
        else
            e->weight = t->data;
    }
    if (st == CORRAL_OK && !(c.by_weight = malloc((im->n ? im->n : 1) * sizeof *c.by_weight)))
        st = CORRAL_OUT_OF_MEMORY;
    if (st != CORRAL_OK) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        imatrix_destroy(&im);
        return NULL;
    }
    c.n = im->n;
    for (uint32_t i = 0; i < im->n; i++) c.by_weight[i] = &im->e[i];
    qsort(c.by_weight, c.n, sizeof *c.by_weight, by_weight);

    kv_cache *kv = kv_cache_new(m, n_ctx, KV_TYPE_F32, err);
    model_runner *r = kv ? model_runner_new(m, n_ctx, pool, err) : NULL;
    const model_logits which = p->process_output ? MODEL_LOGITS_ALL : MODEL_LOGITS_LAST;
    float *logits =
        malloc((which == MODEL_LOGITS_ALL ? n_ctx : 1) * (size_t)hp->n_vocab * sizeof *logits);
    int32_t *chunk = malloc(n_ctx * sizeof *chunk);
    if (!kv || !r) {
        st = err ? err->status : CORRAL_OUT_OF_MEMORY;
    } else if (!logits || !chunk) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    } else {
        model_runner_set_observer(r, observe, &c);
        const tokenizer *tok = model_get_tokenizer(m);
        const int32_t bos = tok_adds_bos(tok) ? tok_bos(tok) : -1;
        for (size_t ci = 0; ci < n_chunks && st == CORRAL_OK; ci++) {
            memcpy(chunk, tokens + ci * n_ctx, n_ctx * sizeof *chunk);
            if (bos >= 0) chunk[0] = bos;
            kv_cache_truncate(kv, 0);
            st = model_forward(r, kv, chunk, n_ctx, which, logits, err);
            if (st == CORRAL_OK && p->progress)
                p->progress(p->progress_user, (uint32_t)(ci + 1), (uint32_t)n_chunks);
        }
    }
    free(chunk);
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    free(c.by_weight);
    if (st == CORRAL_OK) {
        /* Matrices no product used (none in the architectures corral runs) are left out, as
         * llama-imatrix leaves them out. */
        uint32_t kept = 0;
        for (uint32_t i = 0; i < im->n; i++) {
            if (im->e[i].counts[0] > 0) {
                im->e[i].weight = NULL;
                im->e[kept++] = im->e[i];
            } else {
                entry_free(&im->e[i]);
            }
        }
        im->n = kept;
        im->chunk_count = (uint32_t)n_chunks;
        im->chunk_size = n_ctx;
        if (p->dataset && add_dataset(im, p->dataset, strlen(p->dataset)) != CORRAL_OK)
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        if (st == CORRAL_OK) st = finish(im, NULL, err);
    }
    if (st != CORRAL_OK) imatrix_destroy(&im);
    return im;
}
