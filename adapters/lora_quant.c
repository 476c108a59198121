/*
 * lora_quant.c — merge, then quantize once: adapters merged into a full-precision base in f32 and
 * the merged model quantized by the engine's quantize module, in one pass and one rounding
 * (contracts in lora.h: lora_merge_quantize_file, and quantized variants of the cache).
 *
 * The merge is a row source of the quantize module (quantize.h, quantize_source): for each tensor
 * some adapter targets, begin() loads every adapter's factors once, rows() makes rows of the
 * merged tensor in f32 — the base row converted to f32 and every term added, by the same code and
 * in the same order as lora_merge_tensor (lora__add_terms) — and the quantize module quantizes
 * them with llama-quantize's recipe for the file type, over the thread pool, while the image is
 * written. Every other tensor comes from the base file as `corral quantize` takes it, so a
 * variant without adapters is `corral quantize`'s file in an image. Memory: one tensor's factors,
 * the output tensor being written, a few rows per thread.
 */
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

#include "corral/log.h"
#include "corral/quantize.h"
#include "corral/tensor.h"
#include "lora_impl.h"

/* Part of every quantized variant's fingerprint: change it whenever a change here (or in the
 * quantizers or the recipe) changes the bytes of a quantized variant. */
#define LORA_QUANT_DOMAIN "corral.lora.quantized-model/1"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static corral_status parse_type(const char *type, quantize_ftype *ft, corral_error *err) {
    if (!type || quantize_ftype_from_name(type, ft) != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "quantize type '%s': not one of %s",
                                type ? type : "(null)", quantize_ftype_names());
    return CORRAL_OK;
}

corral_status lora__quant_fingerprint(const char *base_path, const lora_source *src, uint32_t n,
                                      const char *type, char out[IMAGE_FINGERPRINT_CHARS + 1],
                                      corral_error *err) {
    quantize_ftype ft;
    corral_status st = parse_type(type, &ft, err);
    if (st != CORRAL_OK) return st;
    return lora__fingerprint(LORA_QUANT_DOMAIN, base_path, src, n, 0, (int64_t)ft, out, err);
}

/* ---- the merge as a row source --------------------------------------------------------------- */

typedef struct merge_source {
    const gguf_file *base;
    const lora_apply *list;
    uint32_t n;
    /* The tensor being written (begin .. end); one at a time. */
    lora_term *terms;
    uint32_t n_terms, max_rank;
} merge_source;

static corral_status source_begin(void *user, uint64_t index, corral_error *err) {
    merge_source *s = user;
    const gguf_tensor *w = gguf_tensor_at(s->base, index);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(w->name.len > 255 ? 255 : w->name.len), w->name.data);
    return lora__terms_load(w, name, s->list, s->n, &s->terms, &s->n_terms, &s->max_rank, err);
}

static corral_status source_rows(void *user, uint64_t index, int64_t row0, int64_t n_rows,
                                 float *dst, corral_error *err) {
    const merge_source *s = user;
    const gguf_tensor *w = gguf_tensor_at(s->base, index);
    const int64_t n_in = w->ne[0];
    const size_t row_bytes = tensor_row_size(w->type, n_in);
    float *coef = malloc((s->max_rank ? s->max_rank : 1) * sizeof *coef);
    if (!coef) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    const tensor_type_traits *tt = tensor_type_get_traits(w->type);
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t o = row0 + r;
        float *row = dst + r * n_in;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)o * row_bytes;
        if (w->type == TENSOR_TYPE_F32)
            memcpy(row, src, (size_t)n_in * sizeof(float));
        else
            tt->to_float(src, row, n_in);
        if (lora__row_changed(s->terms, s->n_terms, o))
            lora__add_terms(row, o, s->terms, s->n_terms, n_in, coef);
    }
    free(coef);
    return CORRAL_OK;
}

static void source_end(void *user, uint64_t index) {
    (void)index;
    merge_source *s = user;
    lora__terms_free(s->terms, s->n_terms);
    s->terms = NULL;
    s->n_terms = s->max_rank = 0;
}

/* ---- metadata and progress ------------------------------------------------------------------- */

typedef struct quant_meta {
    const char *base_abs;
    char **adapter_strs;
    uint32_t n;
    const char *type;
} quant_meta;

static corral_status add_meta(void *user, gguf_builder *b, corral_error *err) {
    const quant_meta *m = user;
    if (gguf_builder_set_str(b, LORA_KEY_BASE, m->base_abs) != CORRAL_OK ||
        (m->n > 0 &&
         gguf_builder_set_str_array(b, LORA_KEY_ADAPTERS, (const char *const *)m->adapter_strs,
                                    m->n) != CORRAL_OK) ||
        gguf_builder_set_str(b, LORA_KEY_QUANTIZE, m->type) != CORRAL_OK)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    return CORRAL_OK;
}

typedef struct progress_log {
    const char *out_path;
    uint32_t last_tenth;
    bool lines;                      /* log them */
    const corral_progress *progress; /* the caller's, or NULL */
} progress_log;

/* The caller's progress at each tensor written, and a line every tenth of them when asked (the
 * daemon's log shows a long build advancing). */
static void log_progress(void *user, const char *phase, uint32_t done, uint32_t total,
                         const char *tensor, uint32_t src_type, uint32_t type) {
    (void)src_type;
    progress_log *pl = user;
    corral_progress_report(pl->progress, done, total);
    if (!pl->lines) return;
    const uint32_t tenth = total ? done * 10 / total : 10;
    if (tenth == pl->last_tenth && done != total) return;
    pl->last_tenth = tenth;
    log_info("quantizing a model variant", LOG_STR("image", pl->out_path), LOG_STR("phase", phase),
             LOG_UINT("done", done), LOG_UINT("tensors", total), LOG_STR("tensor", tensor),
             LOG_STR("type", tensor_type_name(type)));
}

/* ---- the build ------------------------------------------------------------------------------- */

/* Every tensor the quantization would convert must be full precision (a merge into a quantized
 * base is lora_merge_file's, with its own types). */
static corral_status check_full_precision(const gguf_file *base, const char *base_path,
                                          corral_error *err) {
    for (uint64_t i = 0; i < gguf_tensor_count(base); i++) {
        const gguf_tensor *t = gguf_tensor_at(base, i);
        if (t->type == TENSOR_TYPE_F32 || t->type == TENSOR_TYPE_F16 ||
            t->type == TENSOR_TYPE_BF16 || t->n_dims < 2)
            continue;
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "%s: tensor %.*s is %s: quantizing a merge needs a full-precision "
                                "base (F32, F16 or BF16)",
                                base_path, (int)t->name.len, t->name.data,
                                tensor_type_name(t->type));
    }
    return CORRAL_OK;
}

corral_status lora__quant_build(const char *base_path, const lora_source *src, uint32_t n,
                                const char *type, const char *fingerprint, const char *out_path,
                                threadpool *pool, const atomic_int *cancel, int log_progress_lines,
                                const corral_progress *progress, lora_merge_report *rep,
                                corral_error *err) {
    const double t0 = now_seconds();
    quantize_ftype ft;
    corral_status st = parse_type(type, &ft, err);
    if (st != CORRAL_OK) return st;
    gguf_file *base = gguf_open(base_path, err);
    if (!base) return corral_error_prefix(err, "base model");
    st = check_full_precision(base, base_path, err);
    lora_adapter *adapters[LORA_MAX_ADAPTERS] = {0};
    lora_apply list[LORA_MAX_ADAPTERS];
    for (uint32_t i = 0; st == CORRAL_OK && i < n; i++) {
        adapters[i] = lora_adapter_open(src[i].path, base, err);
        if (!adapters[i])
            st = err ? err->status : CORRAL_FORMAT;
        else
            list[i] = (lora_apply){adapters[i], src[i].scale};
    }
    const uint64_t n_tensors = gguf_tensor_count(base);
    uint8_t *from_source = st == CORRAL_OK ? calloc(n_tensors ? n_tensors : 1, 1) : NULL;
    char **adapter_strs = st == CORRAL_OK ? calloc(n ? n : 1, sizeof *adapter_strs) : NULL;
    if (st == CORRAL_OK && (!from_source || !adapter_strs))
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
    uint32_t n_merged = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n_tensors; i++) {
        const gguf_tensor *t = gguf_tensor_at(base, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len > 255 ? 255 : t->name.len),
                 t->name.data);
        for (uint32_t k = 0; k < n && !from_source[i]; k++)
            from_source[i] = lora_adapter_find_target(list[k].adapter, name) >= 0;
        n_merged += from_source[i];
    }
    char abs[PATH_MAX];
    if (!realpath(base_path, abs)) snprintf(abs, sizeof abs, "%s", base_path);
    for (uint32_t i = 0; st == CORRAL_OK && i < n; i++) {
        char ap[PATH_MAX];
        if (!realpath(src[i].path, ap)) snprintf(ap, sizeof ap, "%s", src[i].path);
        const size_t len = strlen(ap) + 32;
        if (!(adapter_strs[i] = malloc(len))) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", out_path);
            break;
        }
        snprintf(adapter_strs[i], len, "%s:%.9g", ap, (double)src[i].scale);
    }
    if (st == CORRAL_OK) {
        merge_source ms = {.base = base, .list = list, .n = n};
        const quantize_source qs = {.from_source = from_source,
                                    .begin = source_begin,
                                    .rows = source_rows,
                                    .end = source_end,
                                    .user = &ms};
        quant_meta meta = {
            .base_abs = abs, .adapter_strs = adapter_strs, .n = n, .type = quantize_ftype_name(ft)};
        progress_log pl = {.out_path = out_path,
                           .last_tenth = UINT32_MAX,
                           .lines = log_progress_lines != 0,
                           .progress = progress};
        quantize_params qp = quantize_params_default();
        qp.ftype = ft;
        qp.pool = pool;
        qp.source = n_merged > 0 ? &qs : NULL;
        qp.cancel = cancel;
        qp.image_kind = LORA_QUANT_IMAGE_KIND;
        qp.image_fingerprint = fingerprint;
        qp.add_metadata = add_meta;
        qp.metadata_user = &meta;
        if (log_progress_lines || (progress && progress->fn)) {
            qp.progress = log_progress;
            qp.progress_user = &pl;
        }
        quantize_result qr = {0};
        st = quantize_write(base, out_path, &qp, &qr, err);
        if (st == CORRAL_OK && rep) {
            memset(rep, 0, sizeof *rep);
            rep->n_adapters = n;
            rep->n_tensors = (uint32_t)n_tensors;
            rep->n_merged_tensors = n_merged;
            struct stat sb;
            rep->file_bytes = stat(out_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
            snprintf(rep->fingerprint, sizeof rep->fingerprint, "%s", fingerprint);
            rep->seconds = now_seconds() - t0;
        }
        quantize_result_free(&qr);
    }
    for (uint32_t i = 0; adapter_strs && i < n; i++) free(adapter_strs[i]);
    free(adapter_strs);
    free(from_source);
    for (uint32_t i = 0; i < n; i++) lora_adapter_destroy(&adapters[i]);
    gguf_destroy(&base);
    if (st == CORRAL_OK) {
        lora__count_merge();
        log_info("quantized a model variant", LOG_STR("base", base_path), LOG_UINT("adapters", n),
                 LOG_STR("type", quantize_ftype_name(ft)), LOG_STR("out", out_path),
                 LOG_F64("seconds", now_seconds() - t0));
    }
    return st;
}

corral_status lora_merge_quantize_file(const char *base_path, const lora_source *src, uint32_t n,
                                       const char *type, const char *out_path, threadpool *pool,
                                       lora_merge_report *rep, corral_error *err) {
    return lora_merge_quantize_file_progress(base_path, src, n, type, out_path, pool, NULL, rep,
                                             err);
}

corral_status lora_merge_quantize_file_progress(const char *base_path, const lora_source *src,
                                                uint32_t n, const char *type, const char *out_path,
                                                threadpool *pool, const corral_progress *progress,
                                                lora_merge_report *rep, corral_error *err) {
    if (!base_path || !out_path)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "lora_merge_quantize_file: NULL argument");
    char fp[IMAGE_FINGERPRINT_CHARS + 1];
    corral_status st = lora__quant_fingerprint(base_path, src, n, type, fp, err);
    if (st != CORRAL_OK) return st;
    return lora__quant_build(base_path, src, n, type, fp, out_path, pool, NULL, 0, progress, rep,
                             err);
}
