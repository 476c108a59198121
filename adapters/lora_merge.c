/*
 * lora_merge.c — merging adapters into a base model, merged-model images, the cache of merged
 * models, and synthetic adapters (contracts in lora.h).
 *
 * The merge of one tensor. Each adapter targeting it contributes a term factor·L·R, L (n_out x r)
 * and R (r x n_in) in f32 (lora_adapter_factors), factor = user scale x scaling. The tensor's rows
 * are split into one contiguous range per thread of the pool; a thread takes its rows one at a
 * time: dequantize the row into f32, add every term's row (row += sum_k factor·L[o][k]·R[k]),
 * quantize it back with the type's reference quantizer. The additions run over column blocks of
 * MERGE_COLS floats, so the block of the row stays in L1 while the r rows of R stream past;
 * for every element the terms and then k are added in ascending order, so the result does not
 * depend on the number of threads or on the blocking. A row whose coefficients are all zero is
 * copied byte for byte (re-quantizing is not always exact for K-quants).
 *
 * A merged model is written as a corral image through the GGUF builder's fill callbacks: the
 * untouched tensors are passed from the base's mapping, the merged ones are produced one at a time
 * while the file is written, so memory use is one tensor plus the factors of its terms.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/log.h"
#include "corral/paths.h"
#include "corral/tensor.h"
#include "lora_impl.h"

#include <xxhash.h>

/* The merge algorithm's version, part of every fingerprint: change it whenever a change of this
 * file (or of the quantizers it calls) changes the bytes of a merged model, so that old cached
 * images become stale instead of being used. */
#define LORA_MERGE_DOMAIN "corral.lora.merged-model/1"
/* Columns of a row updated together (4 KiB of floats: stays in L1 with the R rows' slices). */
#define MERGE_COLS        1024

static atomic_uint_fast64_t merge_counter;

uint64_t lora_merge_count(void) {
    return (uint64_t)atomic_load(&merge_counter);
}

void lora__count_merge(void) {
    atomic_fetch_add(&merge_counter, 1);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- one tensor -------------------------------------------------------------------------------
 */

typedef struct merge_job {
    const uint8_t *src;
    uint8_t *dst;
    const tensor_type_traits *tt;
    int64_t n_in, n_out;
    size_t row_bytes;
    const lora_term *terms;
    uint32_t n_terms;
    float *scratch; /* per thread: a row of n_in floats, then max rank coefficients */
    size_t scratch_stride;
} merge_job;

/* row[j] += sum_k coef[k] · right[k][j], k ascending for every j. */
static void add_low_rank(float *restrict row, const float *restrict coef,
                         const float *restrict right, uint32_t rank, int64_t n) {
    for (int64_t j0 = 0; j0 < n; j0 += MERGE_COLS) {
        int64_t len = n - j0 < MERGE_COLS ? n - j0 : MERGE_COLS;
        float *restrict r = row + j0;
        for (uint32_t k = 0; k < rank; k++) {
            float c = coef[k];
            if (c == 0.0f) continue;
            const float *restrict rk = right + (size_t)k * (size_t)n + (size_t)j0;
            for (int64_t j = 0; j < len; j++) r[j] += c * rk[j];
        }
    }
}

int lora__row_changed(const lora_term *terms, uint32_t n_terms, int64_t o) {
    bool changed = false;
    for (uint32_t t = 0; t < n_terms && !changed; t++) {
        const lora_term *term = &terms[t];
        const float *l = term->left + (size_t)o * term->rank;
        for (uint32_t k = 0; k < term->rank; k++) changed |= term->factor * l[k] != 0.0f;
    }
    return changed;
}

void lora__add_terms(float *row, int64_t o, const lora_term *terms, uint32_t n_terms, int64_t n_in,
                     float *coef) {
    for (uint32_t t = 0; t < n_terms; t++) {
        const lora_term *term = &terms[t];
        const float *l = term->left + (size_t)o * term->rank;
        for (uint32_t k = 0; k < term->rank; k++) coef[k] = term->factor * l[k];
        add_low_rank(row, coef, term->right, term->rank, n_in);
    }
}

static void merge_rows(void *arg, uint32_t ith, uint32_t nth) {
    const merge_job *job = arg;
    int64_t r0 = job->n_out * ith / nth, r1 = job->n_out * (ith + 1) / nth;
    float *row = job->scratch + (size_t)ith * job->scratch_stride;
    float *coef = row + job->n_in;
    for (int64_t o = r0; o < r1; o++) {
        const uint8_t *src = job->src + (size_t)o * job->row_bytes;
        uint8_t *dst = job->dst + (size_t)o * job->row_bytes;
        if (!lora__row_changed(job->terms, job->n_terms, o)) {
            memcpy(dst, src, job->row_bytes);
            continue;
        }
        job->tt->to_float(src, row, job->n_in);
        lora__add_terms(row, o, job->terms, job->n_terms, job->n_in, coef);
        job->tt->from_float(row, dst, job->n_in);
    }
}

void lora__terms_free(lora_term *terms, uint32_t n) {
    for (uint32_t i = 0; terms && i < n; i++) {
        free(terms[i].left);
        free(terms[i].right);
    }
    free(terms);
}

corral_status lora__terms_load(const gguf_tensor *w, const char *name, const lora_apply *list,
                               uint32_t n, lora_term **out, uint32_t *n_terms, uint32_t *max_rank,
                               corral_error *err) {
    *out = NULL;
    *n_terms = *max_rank = 0;
    lora_term *terms = calloc(n ? n : 1, sizeof *terms);
    if (!terms)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
    corral_status st = CORRAL_OK;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && st == CORRAL_OK; i++) {
        int32_t ti = lora_adapter_find_target(list[i].adapter, name);
        if (ti < 0) continue;
        const lora_target *t = &list[i].adapter->targets[ti];
        if (t->n_in != w->ne[0] || t->n_out != w->ne[1]) {
            st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                  "adapter %s: tensor '%s': opened against another base model",
                                  list[i].adapter->path, name);
            break;
        }
        lora_term *term = &terms[k++];
        term->rank = t->rank;
        term->factor = (float)((double)list[i].scale * (double)t->scaling);
        term->left = malloc((size_t)t->n_out * t->rank * sizeof(float));
        term->right = malloc((size_t)t->n_in * t->rank * sizeof(float));
        if (!term->left || !term->right) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
            break;
        }
        st = lora_adapter_factors(list[i].adapter, (uint32_t)ti, term->left, term->right, err);
        if (t->rank > *max_rank) *max_rank = t->rank;
    }
    if (st != CORRAL_OK) {
        lora__terms_free(terms, k);
        *max_rank = 0;
        return st;
    }
    *out = terms;
    *n_terms = k;
    return CORRAL_OK;
}

corral_status lora_merge_tensor(const gguf_file *base, uint64_t tensor_index,
                                const lora_apply *list, uint32_t n, threadpool *pool, void *dst,
                                uint64_t dst_size, corral_error *err) {
    if (!base || (n > 0 && !list) || !dst || tensor_index >= gguf_tensor_count(base)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_merge_tensor: bad argument");
    }
    const gguf_tensor *w = gguf_tensor_at(base, tensor_index);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(w->name.len > 255 ? 255 : w->name.len), w->name.data);
    if (dst_size != w->size) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor '%s': destination of %" PRIu64
                                " bytes, the tensor has %" PRIu64,
                                name, dst_size, w->size);
    }
    lora_term *terms;
    uint32_t n_terms, max_rank;
    corral_status st = lora__terms_load(w, name, list, n, &terms, &n_terms, &max_rank, err);
    if (st != CORRAL_OK) return st;
    if (n_terms == 0) {
        memcpy(dst, w->data, (size_t)w->size);
        lora__terms_free(terms, n_terms);
        return CORRAL_OK;
    }
    uint32_t nth = threadpool_n_threads(pool);
    merge_job job = {
        .src = w->data,
        .dst = dst,
        .tt = tensor_type_get_traits(w->type),
        .n_in = w->ne[0],
        .n_out = w->ne[1],
        .row_bytes = w->ne[1] > 0 ? (size_t)(w->size / (uint64_t)w->ne[1]) : 0,
        .terms = terms,
        .n_terms = n_terms,
        .scratch_stride = (size_t)w->ne[0] + max_rank,
    };
    if (st == CORRAL_OK &&
        (w->n_dims != 2 || !job.tt || !job.tt->to_float || !job.tt->from_float)) {
        st = corral_error_set(err, CORRAL_UNSUPPORTED, "tensor '%s': cannot be re-quantized", name);
    }
    if (st == CORRAL_OK) {
        job.scratch = malloc(job.scratch_stride * nth * sizeof(float));
        if (!job.scratch) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
        }
    }
    if (st == CORRAL_OK) threadpool_run_slices(pool, merge_rows, &job);
    free(job.scratch);
    lora__terms_free(terms, n_terms);
    return st;
}

/* ---- fingerprints -----------------------------------------------------------------------------
 */

static corral_status check_sources(const lora_source *src, uint32_t n, uint32_t min,
                                   corral_error *err) {
    if (n < min || n > LORA_MAX_ADAPTERS || (n > 0 && !src)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "%" PRIu32 " adapters: between %" PRIu32
                                " and %d are merged at once",
                                n, min, LORA_MAX_ADAPTERS);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!src[i].path) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "adapter %" PRIu32 ": no path",
                                    i);
        }
        if (!isfinite(src[i].scale)) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "adapter %s: scale is not a finite number", src[i].path);
        }
    }
    return CORRAL_OK;
}

corral_status lora__fingerprint(const char *domain, const char *base_path, const lora_source *src,
                                uint32_t n, uint32_t min_adapters, int64_t extra,
                                char out[IMAGE_FINGERPRINT_CHARS + 1], corral_error *err) {
    if (!base_path || !out) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_fingerprint: NULL argument");
    }
    corral_status st = check_sources(src, n, min_adapters, err);
    if (st != CORRAL_OK) return st;
    image_fingerprint fp;
    image_fingerprint_init(&fp, domain);
    st = image_fingerprint_add_file(&fp, base_path, err);
    if (st != CORRAL_OK) return corral_error_prefix(err, "base model");
    image_fingerprint_add_u64(&fp, n);
    for (uint32_t i = 0; i < n; i++) {
        char files[2][LORA_PATH_MAX];
        lora_format format;
        int n_files = lora__adapter_files(src[i].path, files, &format, err);
        if (n_files < 0) return err ? err->status : CORRAL_NOT_FOUND;
        image_fingerprint_add_u64(&fp, (uint64_t)format);
        image_fingerprint_add_u64(&fp, (uint64_t)n_files);
        for (int k = 0; k < n_files; k++) {
            st = image_fingerprint_add_file(&fp, files[k], err);
            if (st != CORRAL_OK) return corral_error_prefix(err, "adapter");
        }
        image_fingerprint_add_f32(&fp, src[i].scale);
    }
    if (extra >= 0) image_fingerprint_add_u64(&fp, (uint64_t)extra);
    image_fingerprint_hex(&fp, out);
    return CORRAL_OK;
}

corral_status lora_fingerprint(const char *base_path, const lora_source *src, uint32_t n,
                               char out[IMAGE_FINGERPRINT_CHARS + 1], corral_error *err) {
    return lora__fingerprint(LORA_MERGE_DOMAIN, base_path, src, n, 1, -1, out, err);
}

/* ---- merged-model images ----------------------------------------------------------------------
 */

/* How far a merge got: tensors merged of those targeted, for the caller's callback. */
typedef struct merge_count {
    const corral_progress *progress; /* may be NULL */
    uint64_t done, total;
} merge_count;

typedef struct merge_fill_ctx {
    const gguf_file *base;
    uint64_t index;
    const lora_apply *list;
    uint32_t n;
    threadpool *pool;
    const atomic_int *cancel; /* nonzero: stop before the next tensor */
    merge_count *count;
} merge_fill_ctx;

static corral_status merge_fill(void *user, const char *name, void *dst, uint64_t size,
                                corral_error *err) {
    (void)name;
    const merge_fill_ctx *c = user;
    if (c->cancel && atomic_load(c->cancel))
        return corral_error_set(err, CORRAL_CANCELLED, "the merge was cancelled");
    const corral_status st =
        lora_merge_tensor(c->base, c->index, c->list, c->n, c->pool, dst, size, err);
    if (st == CORRAL_OK)
        corral_progress_report(c->count->progress, ++c->count->done, c->count->total);
    return st;
}

static bool key_has_prefix(gguf_str key, const char *prefix) {
    size_t n = strlen(prefix);
    return key.len >= n && memcmp(key.data, prefix, n) == 0;
}

/* Writes the merged model of already opened adapters to out_path as an image. */
static corral_status write_merged(const gguf_file *base, const char *base_path,
                                  const lora_source *src, const lora_apply *list, uint32_t n,
                                  const char *fingerprint, const char *out_path, threadpool *pool,
                                  const atomic_int *cancel, const corral_progress *progress,
                                  lora_merge_report *rep, corral_error *err) {
    uint64_t n_tensors = gguf_tensor_count(base);
    merge_count count = {.progress = progress};
    merge_fill_ctx *ctx = calloc(n_tensors ? n_tensors : 1, sizeof *ctx);
    char **adapter_strs = calloc(n, sizeof *adapter_strs);
    image_writer *w =
        ctx && adapter_strs ? image_writer_new(LORA_IMAGE_KIND, fingerprint, err) : NULL;
    corral_status st = CORRAL_OK;
    if (!ctx || !adapter_strs) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
    } else if (!w) {
        st = err ? err->status : CORRAL_OUT_OF_MEMORY;
    }
    gguf_builder *b = w ? image_writer_builder(w) : NULL;
    image_writer_set_pace(w, progress);
    /* The base's metadata, minus any image or adapter keys it carries itself (a merged model may
     * serve as the base of another merge). */
    for (uint64_t i = 0; st == CORRAL_OK && i < gguf_kv_count(base); i++) {
        gguf_str key = gguf_kv_key(base, i);
        if (key_has_prefix(key, "corral.image.") || key_has_prefix(key, "corral.lora.")) continue;
        if (gguf_builder_copy_kv(b, base, i) != CORRAL_OK) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
        }
    }
    char abs[PATH_MAX];
    if (st == CORRAL_OK) {
        if (!realpath(base_path, abs)) snprintf(abs, sizeof abs, "%s", base_path);
        for (uint32_t i = 0; i < n && st == CORRAL_OK; i++) {
            char ap[PATH_MAX];
            if (!realpath(src[i].path, ap)) snprintf(ap, sizeof ap, "%s", src[i].path);
            size_t len = strlen(ap) + 32;
            adapter_strs[i] = malloc(len);
            if (!adapter_strs[i]) {
                st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
                break;
            }
            snprintf(adapter_strs[i], len, "%s:%.9g", ap, (double)src[i].scale);
        }
    }
    if (st == CORRAL_OK &&
        (gguf_builder_set_str(b, LORA_KEY_BASE, abs) != CORRAL_OK ||
         gguf_builder_set_str_array(b, LORA_KEY_ADAPTERS, (const char *const *)adapter_strs, n) !=
             CORRAL_OK)) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
    }
    uint32_t merged = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n_tensors; i++) {
        const gguf_tensor *t = gguf_tensor_at(base, i);
        char name[256];
        if (t->name.len >= sizeof name) {
            st = corral_error_set(err, CORRAL_UNSUPPORTED, "%s: tensor name too long", base_path);
            break;
        }
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = '\0';
        bool targeted = false;
        for (uint32_t k = 0; k < n && !targeted; k++) {
            targeted = lora_adapter_find_target(list[k].adapter, name) >= 0;
        }
        if (targeted) {
            ctx[i] = (merge_fill_ctx){base, i, list, n, pool, cancel, &count};
            count.total++;
            st = image_writer_add_tensor_fill(w, name, t->type, t->n_dims, t->ne, merge_fill,
                                              &ctx[i], err);
            merged++;
        } else {
            st = image_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, err);
        }
    }
    if (st == CORRAL_OK) st = image_writer_write(w, out_path, err);
    if (st == CORRAL_OK && rep) {
        rep->n_adapters = n;
        rep->n_tensors = (uint32_t)n_tensors;
        rep->n_merged_tensors = merged;
        struct stat sb;
        rep->file_bytes = stat(out_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        snprintf(rep->fingerprint, sizeof rep->fingerprint, "%s", fingerprint);
    }
    image_writer_destroy(&w);
    for (uint32_t i = 0; adapter_strs && i < n; i++) free(adapter_strs[i]);
    free(adapter_strs);
    free(ctx);
    return st;
}

/* Opens the base and the adapters (every check), then writes the merged image. */
static corral_status merge_to_image(const char *base_path, const lora_source *src, uint32_t n,
                                    const char *fingerprint, const char *out_path, threadpool *pool,
                                    const atomic_int *cancel, const corral_progress *progress,
                                    lora_merge_report *rep, corral_error *err) {
    double t0 = now_seconds();
    gguf_file *base = gguf_open(base_path, err);
    if (!base) return corral_error_prefix(err, "base model");
    lora_adapter *adapters[LORA_MAX_ADAPTERS] = {0};
    lora_apply list[LORA_MAX_ADAPTERS];
    corral_status st = CORRAL_OK;
    for (uint32_t i = 0; i < n; i++) {
        adapters[i] = lora_adapter_open(src[i].path, base, err);
        if (!adapters[i]) {
            st = err ? err->status : CORRAL_FORMAT;
            break;
        }
        list[i] = (lora_apply){adapters[i], src[i].scale};
    }
    if (st == CORRAL_OK) {
        st = write_merged(base, base_path, src, list, n, fingerprint, out_path, pool, cancel,
                          progress, rep, err);
    }
    for (uint32_t i = 0; i < n; i++) lora_adapter_destroy(&adapters[i]);
    gguf_destroy(&base);
    if (st == CORRAL_OK) {
        atomic_fetch_add(&merge_counter, 1);
        if (rep) rep->seconds = now_seconds() - t0;
        log_info("merged LoRA adapters", LOG_STR("base", base_path), LOG_UINT("adapters", n),
                 LOG_STR("out", out_path), LOG_F64("seconds", now_seconds() - t0));
    }
    return st;
}

corral_status lora_merge_file(const char *base_path, const lora_source *src, uint32_t n,
                              const char *out_path, threadpool *pool, lora_merge_report *rep,
                              corral_error *err) {
    return lora_merge_file_progress(base_path, src, n, out_path, pool, NULL, rep, err);
}

corral_status lora_merge_file_progress(const char *base_path, const lora_source *src, uint32_t n,
                                       const char *out_path, threadpool *pool,
                                       const corral_progress *progress, lora_merge_report *rep,
                                       corral_error *err) {
    if (!base_path || !out_path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_merge_file: NULL argument");
    }
    char fp[IMAGE_FINGERPRINT_CHARS + 1];
    corral_status st = lora_fingerprint(base_path, src, n, fp, err);
    if (st != CORRAL_OK) return st;
    if (rep) memset(rep, 0, sizeof *rep);
    return merge_to_image(base_path, src, n, fp, out_path, pool, NULL, progress, rep, err);
}

/* ---- the cache --------------------------------------------------------------------------------
 */

corral_status lora_variant_prepare(const lora_variant_request *req, lora_variant *out,
                                   corral_error *err) {
    if (!req || !out || !req->base_path || !req->cache_dir) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "lora_variant_prepare: base and cache directory are required");
    }
    memset(out, 0, sizeof *out);
    double t0 = now_seconds();
    const char *kind = req->quantize ? LORA_QUANT_IMAGE_KIND : LORA_IMAGE_KIND;
    const char *prefix = req->quantize ? LORA_QUANT_CACHE_FILE_PREFIX : LORA_CACHE_FILE_PREFIX;
    corral_status st = req->quantize
                           ? lora__quant_fingerprint(req->base_path, req->adapters, req->n_adapters,
                                                     req->quantize, out->fingerprint, err)
                           : lora_fingerprint(req->base_path, req->adapters, req->n_adapters,
                                              out->fingerprint, err);
    if (st == CORRAL_OK) st = paths_make_dir(req->cache_dir, err);
    if (st != CORRAL_OK) return st;
    char name[64];
    snprintf(name, sizeof name, "%s%s.gguf", prefix, out->fingerprint);
    int len = snprintf(out->path, sizeof out->path, "%s/%s", req->cache_dir, name);
    if (len < 0 || (size_t)len >= sizeof out->path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "cache directory %s: path too long",
                                req->cache_dir);
    }

    image_problem problem;
    corral_error ierr;
    image *im = image_open(out->path, kind, out->fingerprint, req->verify, &problem, &ierr);
    if (im) {
        image_destroy(&im);
        (void)image_touch(out->path, NULL); /* LRU time; a failure only ages the entry */
        out->cache_hit = 1;
        out->reason = IMAGE_PROBLEM_NONE;
        out->lookup_seconds = now_seconds() - t0;
        struct stat sb;
        out->image_bytes = stat(out->path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        log_debug(req->quantize ? "quantized model from the cache" : "merged model from the cache",
                  LOG_STR("path", out->path), LOG_F64("seconds", out->lookup_seconds));
        return CORRAL_OK;
    }
    out->reason = problem;
    out->lookup_seconds = now_seconds() - t0;
    if (problem != IMAGE_PROBLEM_MISSING) {
        log_warn(req->quantize ? "cached quantized model unusable, rebuilding"
                               : "cached merged model unusable, rebuilding",
                 LOG_STR("path", out->path), LOG_STR("problem", image_problem_name(problem)),
                 LOG_STR("detail", ierr.message));
    }
    double t1 = now_seconds();
    lora_merge_report rep = {0};
    st = req->quantize
             ? lora__quant_build(req->base_path, req->adapters, req->n_adapters, req->quantize,
                                 out->fingerprint, out->path, req->pool, req->cancel, 1,
                                 &req->progress, &rep, err)
             : merge_to_image(req->base_path, req->adapters, req->n_adapters, out->fingerprint,
                              out->path, req->pool, req->cancel, &req->progress, &rep, err);
    if (st != CORRAL_OK) return st;
    out->merge_seconds = now_seconds() - t1;
    out->image_bytes = rep.file_bytes;
    if (req->cache_limit_bytes > 0) {
        corral_error terr;
        if (image_dir_trim(req->cache_dir, LORA_CACHE_FILE_PREFIX "|" LORA_QUANT_CACHE_FILE_PREFIX,
                           req->cache_limit_bytes, name, &out->trim, &terr) != CORRAL_OK) {
            log_warn("cannot trim the LoRA cache", LOG_STR("dir", req->cache_dir),
                     LOG_STR("detail", terr.message));
        }
    }
    return CORRAL_OK;
}

/* ---- synthetic adapters -----------------------------------------------------------------------
 */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct synth_fill_ctx {
    uint64_t seed;
    float std;
    uint32_t type;
} synth_fill_ctx;

/* Uniform draws in [-sqrt(3)·std, sqrt(3)·std) (standard deviation std), from a PRNG seeded by
 * the adapter's seed and the tensor's name. */
static corral_status synth_fill(void *user, const char *name, void *dst, uint64_t size,
                                corral_error *err) {
    (void)err;
    const synth_fill_ctx *c = user;
    /* XXH64, not image_hash64 (XXH3 since image version 2): the draws, and so every synthetic
     * adapter made before, stay as they were. */
    uint64_t state = XXH64(name, strlen(name), c->seed);
    float half = 1.7320508f * c->std;
    uint64_t n = size / (c->type == TENSOR_TYPE_F16 ? 2 : 4);
    for (uint64_t i = 0; i < n; i++) {
        float u = (float)(splitmix64(&state) >> 40) * (1.0f / 16777216.0f);
        float v = (2.0f * u - 1.0f) * half;
        if (c->type == TENSOR_TYPE_F16) {
            ((uint16_t *)dst)[i] = tensor_f32_to_fp16(v);
        } else {
            ((float *)dst)[i] = v;
        }
    }
    return CORRAL_OK;
}

/* Whether base tensor `name` is one the synthetic adapter targets. */
static bool synth_targets(const char *name, uint32_t targets) {
    static const struct {
        const char *suffix;
        uint32_t bit;
    } roles[] = {
        {".attn_q.weight", LORA_SYNTH_ATTN_Q},     {".attn_k.weight", LORA_SYNTH_ATTN_K},
        {".attn_v.weight", LORA_SYNTH_ATTN_V},     {".attn_output.weight", LORA_SYNTH_ATTN_OUT},
        {".ffn_gate.weight", LORA_SYNTH_FFN_GATE}, {".ffn_up.weight", LORA_SYNTH_FFN_UP},
        {".ffn_down.weight", LORA_SYNTH_FFN_DOWN},
        /* phi3's fused Q, K and V (and its fused gate+up is its ffn_up) */
        {".attn_qkv.weight", LORA_SYNTH_ATTN_Q | LORA_SYNTH_ATTN_K | LORA_SYNTH_ATTN_V}};
    if (strcmp(name, "output.weight") == 0) return (targets & LORA_SYNTH_OUTPUT) != 0;
    if (strncmp(name, "blk.", 4) != 0) return false;
    size_t len = strlen(name);
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        size_t sl = strlen(roles[i].suffix);
        if (len > sl && strcmp(name + len - sl, roles[i].suffix) == 0) {
            return (targets & roles[i].bit) != 0;
        }
    }
    return false;
}

corral_status lora_synth_write(const lora_synth_params *p, const char *out_path,
                               corral_error *err) {
    if (!p || !p->base_path || !out_path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_synth_write: NULL argument");
    }
    if (p->rank < 1 || p->rank > 4096 || !isfinite(p->alpha) || !(p->a_std > 0) ||
        !(p->b_std > 0) || (p->type != TENSOR_TYPE_F32 && p->type != TENSOR_TYPE_F16) ||
        p->targets == 0) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "synthetic adapter: rank %" PRIu32
                                " (1..4096), alpha, standard deviations (> 0), type (F32 or F16) "
                                "and targets must all be valid",
                                p->rank);
    }
    gguf_file *base = gguf_open(p->base_path, err);
    if (!base) return corral_error_prefix(err, "base model");
    gguf_str arch;
    corral_status st = gguf_get_str(base, "general.architecture", &arch, err);
    gguf_builder *b = st == CORRAL_OK ? gguf_builder_new() : NULL;
    uint64_t n = gguf_tensor_count(base);
    synth_fill_ctx *ctx = calloc(2 * (n ? n : 1), sizeof *ctx);
    if (st == CORRAL_OK && (!b || !ctx)) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
    }
    if (st == CORRAL_OK) {
        char arch_s[64], name[160];
        snprintf(arch_s, sizeof arch_s, "%.*s", (int)(arch.len > 63 ? 63 : arch.len), arch.data);
        snprintf(name, sizeof name, "corral synthetic LoRA r%" PRIu32 " seed %" PRIu64, p->rank,
                 p->seed);
        if (gguf_builder_set_str(b, "general.architecture", arch_s) != CORRAL_OK ||
            gguf_builder_set_str(b, "general.type", "adapter") != CORRAL_OK ||
            gguf_builder_set_str(b, "adapter.type", "lora") != CORRAL_OK ||
            gguf_builder_set_f32(b, "adapter.lora.alpha", p->alpha) != CORRAL_OK ||
            gguf_builder_set_str(b, "general.name", name) != CORRAL_OK) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
        }
    }
    uint32_t added = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(base, i);
        char name[256];
        if (t->name.len >= 240) continue;
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (t->n_dims != 2 || !synth_targets(name, p->targets)) continue;
        char na[256], nb[256];
        snprintf(na, sizeof na, "%s.lora_a", name);
        snprintf(nb, sizeof nb, "%s.lora_b", name);
        int64_t ne_a[2] = {t->ne[0], p->rank}, ne_b[2] = {p->rank, t->ne[1]};
        ctx[2 * i] = (synth_fill_ctx){p->seed, p->a_std, p->type};
        ctx[2 * i + 1] = (synth_fill_ctx){p->seed, p->b_std, p->type};
        st = gguf_builder_add_tensor_fill(b, na, p->type, 2, ne_a, synth_fill, &ctx[2 * i], err);
        if (st == CORRAL_OK) {
            st = gguf_builder_add_tensor_fill(b, nb, p->type, 2, ne_b, synth_fill, &ctx[2 * i + 1],
                                              err);
        }
        added++;
    }
    if (st == CORRAL_OK && added == 0) {
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "synthetic adapter: the base model %s has none of the targeted "
                              "tensors",
                              p->base_path);
    }
    if (st == CORRAL_OK) st = gguf_builder_write(b, out_path, err);
    gguf_builder_destroy(&b);
    free(ctx);
    gguf_destroy(&base);
    return st;
}
