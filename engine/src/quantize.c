/*
 * quantize.c — quantizing a model file: the row work over a thread pool, error measurement, the
 * size budget, and the streaming write (contracts and the algorithms in quantize.h; the choice of
 * types is quantize_plan.c's).
 *
 * A tensor is worked on in row ranges, one per slice of the pool (threadpool_run_slices), each
 * slice in chunks of a few rows: the rows are brought to f32 in the slice's own buffer (from the
 * mapped input, converted from F16/BF16 or dequantized, or from the caller's source), quantized
 * with tensor_quantize_rows, and, when errors are measured, dequantized again and compared. Every
 * row is quantized independently, so the bytes do not depend on the number of threads; the error
 * sums are kept per slice in double and added in slice order.
 *
 * The budget pass measures each eligible tensor at every candidate type in one sweep (the f32
 * rows are made once per chunk and quantized to each candidate in turn), then chooses types by
 * the greedy rule of quantize.h.
 */
#include "corral/quantize.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "corral/image.h"
#include "corral/log.h"
#include "quantize_impl.h"

/* Floats per chunk of rows a slice works on at once (at least one row). */
#define QUANTIZE_CHUNK_FLOATS 16384
/* Candidate types of the size budget, cheapest first. */
static const tensor_type budget_types[] = {
    TENSOR_TYPE_Q4_0, TENSOR_TYPE_Q4_K, TENSOR_TYPE_Q4_1, TENSOR_TYPE_Q5_0, TENSOR_TYPE_Q5_K,
    TENSOR_TYPE_Q5_1, TENSOR_TYPE_Q6_K, TENSOR_TYPE_Q8_0, TENSOR_TYPE_F16,
};
#define N_BUDGET_TYPES       (sizeof budget_types / sizeof budget_types[0])
/* general.quantization_version, as llama-quantize writes it (GGML_QNT_VERSION). */
#define QUANTIZE_QNT_VERSION 2
/* llama-quantize keeps the first 127 bytes of the strings it records. */
#define QUANTIZE_KV_STR_MAX  127

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

quantize_params quantize_params_default(void) {
    return (quantize_params){
        .ftype = QUANTIZE_FTYPE_Q8_0, .output_tensor_type = -1, .token_embedding_type = -1};
}

void quantize_result_free(quantize_result *r) {
    if (!r) return;
    free(r->tensors);
    r->tensors = NULL;
    r->n_tensors = 0;
}

/* ---- the row work ---------------------------------------------------------------------------- */

/* Error sums of one type over some rows: sum w^2, sum (w - q)^2, and the same weighted by the
 * importance of each column. */
typedef struct err_sums {
    double w2, e2, aw2, ae2;
} err_sums;

typedef struct row_job {
    const quantize_params *p;
    const quant_tensor *t;
    const tensor_type *types; /* the types to quantize to: one (a write) or the candidates */
    uint32_t n_types;
    uint8_t *dst; /* a write: the tensor's bytes in types[0]; NULL: measure only */
    int measure;
    float *scratch; /* per slice: f32 rows, dequantized rows, quantized bytes */
    size_t scratch_floats;
    int64_t chunk_rows;
    err_sums *sums;        /* [slice][n_types] */
    corral_status *status; /* per slice */
    corral_error *errs;    /* per slice */
} row_job;

/* Rows [r0, r0 + n) of the tensor in f32, into dst. */
static corral_status rows_f32(const row_job *job, int64_t r0, int64_t n, float *dst,
                              corral_error *err) {
    const quant_tensor *t = job->t;
    const int64_t ncols = t->t->ne[0];
    if (t->from_source)
        return job->p->source->rows(job->p->source->user, t->index, r0, n, dst, err);
    const size_t row_bytes = tensor_row_size(t->t->type, ncols);
    const uint8_t *src = (const uint8_t *)t->t->data + (size_t)r0 * row_bytes;
    if (t->t->type == TENSOR_TYPE_F32) {
        memcpy(dst, src, (size_t)(n * ncols) * sizeof(float));
    } else {
        tensor_type_get_traits(t->t->type)->to_float(src, dst, n * ncols);
    }
    return CORRAL_OK;
}

static void add_errors(const float *w, const float *q, int64_t n_rows, int64_t ncols,
                       const float *importance, err_sums *s) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *wr = w + r * ncols, *qr = q + r * ncols;
        for (int64_t j = 0; j < ncols; j++) {
            const double wv = wr[j], d = (double)wr[j] - (double)qr[j];
            s->w2 += wv * wv;
            s->e2 += d * d;
            if (importance) {
                s->aw2 += importance[j] * wv * wv;
                s->ae2 += importance[j] * d * d;
            }
        }
    }
}

static void rows_slice(void *arg, uint32_t ith, uint32_t nth) {
    row_job *job = arg;
    const quant_tensor *t = job->t;
    const int64_t ncols = t->t->ne[0], n_rows = t->n_rows;
    const int64_t per_matrix = t->t->n_dims > 1 ? t->t->ne[1] : 1;
    float *f32 = job->scratch + (size_t)ith * job->scratch_floats;
    float *deq = f32 + job->chunk_rows * ncols;
    void *qbuf = deq + job->chunk_rows * ncols;
    const int64_t r_begin = n_rows * ith / nth, r_end = n_rows * (ith + 1) / nth;
    for (int64_t r0 = r_begin; r0 < r_end;) {
        int64_t n = r_end - r0 < job->chunk_rows ? r_end - r0 : job->chunk_rows;
        const float *imp = NULL;
        if (t->importance) {
            /* A chunk stays within one matrix of a 3-D tensor: each has its own importance. */
            const int64_t m = r0 / per_matrix, left = (m + 1) * per_matrix - r0;
            if (n > left) n = left;
            imp = t->importance + m * t->importance_stride;
        }
        corral_status st = rows_f32(job, r0, n, f32, &job->errs[ith]);
        if (st != CORRAL_OK) {
            job->status[ith] = st;
            return;
        }
        for (uint32_t k = 0; k < job->n_types; k++) {
            const tensor_type type = job->types[k];
            const size_t row_bytes = tensor_row_size(type, ncols);
            void *q = job->dst ? job->dst + (size_t)r0 * row_bytes : qbuf;
            tensor_quantize_rows(type, f32, q, n, ncols, imp);
            if (job->measure) {
                const tensor_type_traits *tt = tensor_type_get_traits(type);
                if (type == TENSOR_TYPE_F32)
                    memcpy(deq, q, (size_t)(n * ncols) * sizeof(float));
                else
                    tt->to_float(q, deq, n * ncols);
                add_errors(f32, deq, n, ncols, imp, &job->sums[(size_t)ith * job->n_types + k]);
            }
        }
        r0 += n;
    }
}

/* Quantize (dst set) or only measure (dst NULL) tensor t to types[0..n_types) over the pool;
 * with measure, sums[k] receives type k's error sums. */
static corral_status run_rows(const quantize_params *p, const quant_tensor *t,
                              const tensor_type *types, uint32_t n_types, uint8_t *dst, int measure,
                              err_sums *sums, corral_error *err) {
    const uint32_t nth = threadpool_n_threads(p->pool);
    const int64_t ncols = t->t->ne[0];
    if (ncols <= 0 || t->n_rows <= 0) { /* an empty tensor: nothing to quantize or measure */
        for (uint32_t k = 0; sums && k < n_types; k++) sums[k] = (err_sums){0};
        return CORRAL_OK;
    }
    row_job job = {
        .p = p, .t = t, .types = types, .n_types = n_types, .dst = dst, .measure = measure};
    job.chunk_rows = QUANTIZE_CHUNK_FLOATS / ncols;
    if (job.chunk_rows < 1) job.chunk_rows = 1;
    /* f32 rows, dequantized rows, and quantized bytes (at most 4 bytes a value). */
    job.scratch_floats = (size_t)(3 * job.chunk_rows * ncols);
    job.scratch = malloc(job.scratch_floats * nth * sizeof(float));
    job.sums = calloc((size_t)nth * n_types, sizeof *job.sums);
    job.status = calloc(nth, sizeof *job.status);
    job.errs = calloc(nth, sizeof *job.errs);
    corral_status st = CORRAL_OK;
    if (!job.scratch || !job.sums || !job.status || !job.errs) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor %s: out of memory", t->name);
    } else {
        threadpool_run_slices(p->pool, rows_slice, &job);
        for (uint32_t i = 0; i < nth && st == CORRAL_OK; i++) {
            if (job.status[i] != CORRAL_OK) {
                st = job.status[i];
                if (err) *err = job.errs[i];
                corral_error_prefix(err, "tensor %s", t->name);
            }
        }
        for (uint32_t k = 0; sums && st == CORRAL_OK && k < n_types; k++) {
            sums[k] = (err_sums){0};
            for (uint32_t i = 0; i < nth; i++) {
                const err_sums *s = &job.sums[(size_t)i * n_types + k];
                sums[k].w2 += s->w2;
                sums[k].e2 += s->e2;
                sums[k].aw2 += s->aw2;
                sums[k].ae2 += s->ae2;
            }
        }
    }
    free(job.scratch);
    free(job.sums);
    free(job.status);
    free(job.errs);
    return st;
}

static double rel_rms(double err2, double ref2) {
    return ref2 > 0 ? sqrt(err2 / ref2) : 0.0;
}

static void set_errors(quant_tensor *t, const err_sums *s) {
    t->measured = 1;
    t->weight_error = rel_rms(s->e2, s->w2);
    t->output_error = t->importance ? rel_rms(s->ae2, s->aw2) : -1.0;
}

static corral_status source_begin(const quantize_params *p, const quant_tensor *t,
                                  corral_error *err) {
    if (!t->from_source || !p->source->begin) return CORRAL_OK;
    return p->source->begin(p->source->user, t->index, err);
}

static void source_end(const quantize_params *p, const quant_tensor *t) {
    if (t->from_source && p->source->end) p->source->end(p->source->user, t->index);
}

static uint64_t tensor_bytes(const quant_tensor *t, uint32_t type) {
    return (uint64_t)t->n_rows * tensor_row_size(type, t->t->ne[0]);
}

static int cancelled(const quantize_params *p) {
    return p->cancel && atomic_load(p->cancel);
}

/* ---- the size budget ------------------------------------------------------------------------- */

typedef struct candidate {
    tensor_type type;
    uint64_t bytes;
    double error; /* noise-to-signal ratio */
} candidate;

typedef struct budget_tensor {
    candidate c[N_BUDGET_TYPES];
    uint32_t n;  /* the hull's points, by bytes */
    uint32_t at; /* the point chosen */
    int blocked; /* its next upgrade does not fit */
} budget_tensor;

static int by_bytes(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? -1 : 1;
    return x->error < y->error ? -1 : x->error > y->error;
}

/* Keep the lower convex hull of the candidates: error strictly falling with bytes, and the
 * saving per byte of each step no larger than the previous step's. */
static void hull(budget_tensor *b) {
    qsort(b->c, b->n, sizeof b->c[0], by_bytes);
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        const candidate c = b->c[i];
        if (k > 0 && c.error >= b->c[k - 1].error) continue; /* dominated */
        while (k >= 2) {
            const candidate *p0 = &b->c[k - 2], *p1 = &b->c[k - 1];
            const double s01 = (p0->error - p1->error) / (double)(p1->bytes - p0->bytes);
            const double s12 = (p1->error - c.error) / (double)(c.bytes - p1->bytes);
            if (s12 >= s01)
                k--; /* p1 is under the hull: skipping it saves more per byte */
            else
                break;
        }
        b->c[k++] = c;
    }
    b->n = k;
}

/* Set t's sensitivity from the probe: the KL divergence the tensor alone causes at its smallest
 * candidate type (the strongest signal), over that candidate's noise-to-signal ratio nsr[]. */
static corral_status measure_sensitivity(const quantize_params *p, quant_probe *probe,
                                         quant_tensor *t, const tensor_type *types, uint32_t k,
                                         const double *nsr, corral_error *err) {
    uint32_t s = 0;
    for (uint32_t j = 1; j < k; j++)
        if (tensor_bytes(t, types[j]) < tensor_bytes(t, types[s])) s = j;
    t->sensitivity = 0;
    if (!(nsr[s] > 0)) return CORRAL_OK; /* quantized exactly: nothing to measure */
    const size_t bytes = (size_t)tensor_bytes(t, types[s]);
    uint8_t *q = malloc(bytes ? bytes : 1);
    if (!q) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor %s: out of memory", t->name);
    corral_status st = run_rows(p, t, &types[s], 1, q, 0, NULL, err);
    double kl = 0;
    if (st == CORRAL_OK) st = quant_probe_kl(probe, t->name, types[s], q, &kl, err);
    free(q);
    if (st == CORRAL_OK) t->sensitivity = kl / nsr[s];
    return st;
}

/* Measure the eligible tensors at every candidate type and choose their types (quantize.h). */
static corral_status choose_budget(const gguf_file *in, const quantize_params *p, quant_tensor *ts,
                                   uint32_t n, corral_error *err) {
    uint64_t n_elements = 0, fixed = 0;
    for (uint32_t i = 0; i < n; i++) n_elements += ts[i].n_elements;
    budget_tensor *bt = calloc(n ? n : 1, sizeof *bt);
    if (!bt) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    uint32_t n_eligible = 0, done = 0;
    for (uint32_t i = 0; i < n; i++) n_eligible += (uint32_t)ts[i].eligible;
    corral_status st = CORRAL_OK;
    quant_probe *probe = NULL;
    if (p->calibration_text) {
        st = quant_probe_new(gguf_path(in), p->calibration_text, p->calibration_len,
                             p->calibration_tokens ? p->calibration_tokens
                                                   : QUANTIZE_CALIBRATION_TOKENS,
                             p->pool, &probe, err);
    }
    for (uint32_t i = 0; i < n && st == CORRAL_OK; i++) {
        quant_tensor *t = &ts[i];
        if (!t->eligible) {
            fixed += t->convert ? tensor_bytes(t, t->type) : t->t->size;
            continue;
        }
        if (cancelled(p)) {
            st = corral_error_set(err, CORRAL_CANCELLED, "the quantization was cancelled");
            break;
        }
        tensor_type types[N_BUDGET_TYPES];
        uint32_t k = 0;
        for (size_t j = 0; j < N_BUDGET_TYPES; j++)
            if (t->t->ne[0] % tensor_type_get_traits(budget_types[j])->block_size == 0)
                types[k++] = budget_types[j];
        /* The importance entry, if any, was looked up for the recipe's type; a candidate that
         * is a float type simply ignores it. */
        if (!t->importance && p->imatrix) {
            uint64_t ni;
            const float *imp = imatrix_find(p->imatrix, t->name, &ni);
            if (imp && ni == (uint64_t)t->t->ne[0]) {
                t->importance = imp;
                t->importance_stride = t->t->ne[0];
            }
        }
        err_sums sums[N_BUDGET_TYPES];
        double nsr[N_BUDGET_TYPES];
        st = source_begin(p, t, err);
        if (st == CORRAL_OK) st = run_rows(p, t, types, k, NULL, 1, sums, err);
        for (uint32_t j = 0; st == CORRAL_OK && j < k; j++)
            nsr[j] = t->importance ? (sums[j].aw2 > 0 ? sums[j].ae2 / sums[j].aw2 : 0)
                                   : (sums[j].w2 > 0 ? sums[j].e2 / sums[j].w2 : 0);
        if (st == CORRAL_OK && probe) st = measure_sensitivity(p, probe, t, types, k, nsr, err);
        source_end(p, t);
        gguf_release_range(in, t->t->data, (size_t)t->t->size);
        for (uint32_t j = 0; st == CORRAL_OK && j < k; j++)
            bt[i].c[j] = (candidate){types[j], tensor_bytes(t, types[j]), nsr[j] * t->sensitivity};
        bt[i].n = k;
        hull(&bt[i]);
        if (p->progress)
            p->progress(p->progress_user, "measure", ++done, n_eligible, t->name, t->t->type,
                        bt[i].c[0].type);
    }
    const double budget = p->target_bpw * (double)n_elements / 8.0;
    double used = (double)fixed;
    for (uint32_t i = 0; st == CORRAL_OK && i < n; i++)
        if (ts[i].eligible) used += (double)bt[i].c[0].bytes;
    if (st == CORRAL_OK && used > budget) {
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "target %.4g bits per weight is below the smallest file these "
                              "tensors make (%.4g)",
                              p->target_bpw, used * 8.0 / (double)n_elements);
    }
    while (st == CORRAL_OK) {
        /* The upgrade that saves the most error per byte among those not blocked. */
        int64_t best = -1;
        double best_ratio = 0;
        for (uint32_t i = 0; i < n; i++) {
            const budget_tensor *b = &bt[i];
            if (!ts[i].eligible || b->blocked || b->at + 1 >= b->n) continue;
            const candidate *c0 = &b->c[b->at], *c1 = &b->c[b->at + 1];
            const double ratio = (c0->error - c1->error) / (double)(c1->bytes - c0->bytes);
            if (best < 0 || ratio > best_ratio) {
                best = i;
                best_ratio = ratio;
            }
        }
        if (best < 0) break;
        budget_tensor *b = &bt[best];
        const double extra = (double)(b->c[b->at + 1].bytes - b->c[b->at].bytes);
        if (used + extra <= budget) {
            used += extra;
            b->at++;
        } else {
            b->blocked = 1;
        }
    }
    for (uint32_t i = 0; st == CORRAL_OK && i < n; i++) {
        quant_tensor *t = &ts[i];
        if (!t->eligible) continue;
        const candidate *c = &bt[i].c[bt[i].at];
        t->reason = QUANTIZE_REASON_BUDGET;
        t->type = c->type;
        t->budget_error = c->error;
        t->convert = t->type != t->t->type || t->from_source;
        if (!tensor_type_get_traits(t->type)->is_quantized) t->importance = NULL;
    }
    quant_probe_destroy(&probe);
    free(bt);
    return st;
}

/* ---- planning -------------------------------------------------------------------------------- */

/* The plan, with the budget applied and (measure) errors for the chosen types when dry. */
static corral_status make_plan(const gguf_file *in, const quantize_params *p, int dry,
                               quant_tensor **out, uint32_t *n_out, uint32_t *n_fallback,
                               corral_error *err) {
    quant_tensor *ts;
    corral_status st = quantize__plan_types(in, p, &ts, n_fallback, err);
    if (st != CORRAL_OK) return st;
    const uint32_t n = (uint32_t)gguf_tensor_count(in);
    if (p->target_bpw > 0) st = choose_budget(in, p, ts, n, err);
    for (uint32_t i = 0; dry && p->measure && st == CORRAL_OK && i < n; i++) {
        quant_tensor *t = &ts[i];
        if (!t->convert || !tensor_type_get_traits(t->type)->is_quantized) continue;
        if (cancelled(p)) {
            st = corral_error_set(err, CORRAL_CANCELLED, "the quantization was cancelled");
            break;
        }
        err_sums s;
        const tensor_type type = t->type;
        st = source_begin(p, t, err);
        if (st == CORRAL_OK) st = run_rows(p, t, &type, 1, NULL, 1, &s, err);
        source_end(p, t);
        gguf_release_range(in, t->t->data, (size_t)t->t->size);
        if (st == CORRAL_OK) set_errors(t, &s);
    }
    if (st != CORRAL_OK) {
        free(ts);
        return st;
    }
    *out = ts;
    *n_out = n;
    return CORRAL_OK;
}

static corral_status fill_result(const quantize_params *p, const quant_tensor *ts, uint32_t n,
                                 uint32_t n_fallback, quantize_result *out, corral_error *err) {
    memset(out, 0, sizeof *out);
    out->predicted_kl = p->calibration_text ? 0 : -1;
    out->tensors = calloc(n ? n : 1, sizeof *out->tensors);
    if (!out->tensors) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    out->n_tensors = n;
    out->n_fallback = n_fallback;
    for (uint32_t i = 0; i < n; i++) {
        const quant_tensor *t = &ts[i];
        quantize_tensor_info *ti = &out->tensors[i];
        snprintf(ti->name, sizeof ti->name, "%s", t->name);
        ti->index = t->index;
        ti->n_dims = t->t->n_dims;
        memcpy(ti->ne, t->t->ne, sizeof ti->ne);
        ti->n_elements = t->n_elements;
        ti->src_type = t->t->type;
        ti->type = t->type;
        ti->src_bytes = t->t->size;
        ti->bytes = t->convert ? tensor_bytes(t, t->type) : t->t->size;
        ti->reason = t->reason;
        ti->converted = t->convert;
        ti->importance = t->convert && t->importance != NULL;
        ti->measured = t->measured;
        ti->weight_error = t->weight_error;
        ti->output_error = t->output_error;
        ti->sensitivity = t->reason == QUANTIZE_REASON_BUDGET ? t->sensitivity : 0;
        out->n_elements += ti->n_elements;
        out->bytes_in += ti->src_bytes;
        out->bytes_out += ti->bytes;
        out->n_importance += (uint32_t)ti->importance;
        if (p->calibration_text && t->reason == QUANTIZE_REASON_BUDGET)
            out->predicted_kl += t->budget_error;
    }
    if (out->n_elements) {
        out->bpw_in = (double)out->bytes_in * 8.0 / (double)out->n_elements;
        out->bpw_out = (double)out->bytes_out * 8.0 / (double)out->n_elements;
    }
    return CORRAL_OK;
}

corral_status quantize_plan(const gguf_file *in, const quantize_params *params,
                            quantize_result *out, corral_error *err) {
    if (!in || !params || !out)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "quantize_plan: NULL argument");
    const double t0 = now_seconds();
    quant_tensor *ts;
    uint32_t n, n_fallback;
    corral_status st = make_plan(in, params, 1, &ts, &n, &n_fallback, err);
    if (st != CORRAL_OK) return st;
    st = fill_result(params, ts, n, n_fallback, out, err);
    out->seconds = now_seconds() - t0;
    free(ts);
    return st;
}

/* ---- writing --------------------------------------------------------------------------------- */

typedef struct write_ctx {
    const quantize_params *p;
    const gguf_file *in;
    quant_tensor *t;
    uint32_t done, total; /* shared progress: every ctx points at the first one's */
    struct write_ctx *first;
} write_ctx;

static corral_status fill_tensor(void *user, const char *name, void *dst, uint64_t size,
                                 corral_error *err) {
    (void)name;
    write_ctx *c = user;
    const quantize_params *p = c->p;
    quant_tensor *t = c->t;
    if (cancelled(p))
        return corral_error_set(err, CORRAL_CANCELLED, "the quantization was cancelled");
    corral_status st = CORRAL_OK;
    if (!t->convert) {
        memcpy(dst, t->t->data, (size_t)size);
    } else {
        const tensor_type type = t->type;
        const int measure = p->measure && tensor_type_get_traits(type)->is_quantized;
        err_sums s;
        st = source_begin(p, t, err);
        if (st == CORRAL_OK) st = run_rows(p, t, &type, 1, dst, measure, &s, err);
        source_end(p, t);
        if (st == CORRAL_OK && measure) set_errors(t, &s);
    }
    /* The input is read once, front to back: its pages are given back as each tensor is done, so
     * the process holds one tensor of it at a time (they stay in the page cache). */
    gguf_release_range(c->in, t->t->data, (size_t)t->t->size);
    if (st == CORRAL_OK && p->progress)
        p->progress(p->progress_user, "write", ++c->first->done, c->first->total, t->name,
                    t->t->type, t->type);
    return st;
}

static int key_has_prefix(gguf_str key, const char *prefix) {
    const size_t n = strlen(prefix);
    return key.len >= n && memcmp(key.data, prefix, n) == 0;
}

/* A string cut to llama-quantize's 127 bytes. */
static void kv_str(char out[QUANTIZE_KV_STR_MAX + 1], const char *s) {
    snprintf(out, QUANTIZE_KV_STR_MAX + 1, "%s", s);
}

static corral_status add_metadata(gguf_builder *b, const gguf_file *in, const quantize_params *p,
                                  const char *out_path, corral_error *err) {
    corral_status st = CORRAL_OK;
    for (uint64_t i = 0; i < gguf_kv_count(in) && st == CORRAL_OK; i++) {
        const gguf_str key = gguf_kv_key(in, i);
        /* Set below, after the rest, as llama.cpp sets them; an input image's own keys describe
         * the input. */
        if (gguf_str_eq(key, "general.quantization_version") ||
            gguf_str_eq(key, "general.file_type") || key_has_prefix(key, "corral.image."))
            continue;
        st = gguf_builder_copy_kv(b, in, i);
    }
    if (st == CORRAL_OK)
        st = gguf_builder_set_u32(b, "general.quantization_version", QUANTIZE_QNT_VERSION);
    if (st == CORRAL_OK) st = gguf_builder_set_u32(b, "general.file_type", (uint32_t)p->ftype);
    if (st == CORRAL_OK && p->imatrix) {
        char s[QUANTIZE_KV_STR_MAX + 1];
        kv_str(s, p->imatrix_path ? p->imatrix_path : "");
        st = gguf_builder_set_str(b, "quantize.imatrix.file", s);
        if (st == CORRAL_OK && imatrix_n_datasets(p->imatrix) > 0) {
            kv_str(s, imatrix_dataset(p->imatrix, 0));
            st = gguf_builder_set_str(b, "quantize.imatrix.dataset", s);
        }
        if (st == CORRAL_OK)
            st = gguf_builder_set_u32(b, "quantize.imatrix.entries_count",
                                      imatrix_n_entries(p->imatrix));
        if (st == CORRAL_OK && imatrix_chunk_count(p->imatrix) > 0)
            st = gguf_builder_set_u32(b, "quantize.imatrix.chunks_count",
                                      imatrix_chunk_count(p->imatrix));
    }
    if (st != CORRAL_OK)
        return corral_error_set(err, st, "%s: cannot build the metadata", out_path);
    if (p->add_metadata) st = p->add_metadata(p->metadata_user, b, err);
    return st;
}

corral_status quantize_write(const gguf_file *in, const char *out_path,
                             const quantize_params *params, quantize_result *out,
                             corral_error *err) {
    if (!in || !out_path || !params)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "quantize_write: NULL argument");
    const quantize_params *p = params;
    if ((p->image_kind == NULL) != (p->image_fingerprint == NULL))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "an image needs both a kind and a fingerprint");
    const double t0 = now_seconds();
    quant_tensor *ts;
    uint32_t n, n_fallback;
    corral_status st = make_plan(in, p, 0, &ts, &n, &n_fallback, err);
    if (st != CORRAL_OK) return st;

    image_writer *w = NULL;
    gguf_builder *b = NULL;
    if (p->image_kind) {
        w = image_writer_new(p->image_kind, p->image_fingerprint, err);
        b = w ? image_writer_builder(w) : NULL;
        if (!w) st = err ? err->status : CORRAL_OUT_OF_MEMORY;
    } else if (!(b = gguf_builder_new())) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    write_ctx *ctx = st == CORRAL_OK ? calloc(n ? n : 1, sizeof *ctx) : NULL;
    if (st == CORRAL_OK && !ctx) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    if (st == CORRAL_OK) st = add_metadata(b, in, p, out_path, err);
    for (uint32_t i = 0; st == CORRAL_OK && i < n; i++) {
        quant_tensor *t = &ts[i];
        ctx[i] = (write_ctx){.p = p, .in = in, .t = t, .first = &ctx[0], .total = n};
        st = w ? image_writer_add_tensor_fill(w, t->name, t->type, t->t->n_dims, t->t->ne,
                                              fill_tensor, &ctx[i], err)
               : gguf_builder_add_tensor_fill(b, t->name, t->type, t->t->n_dims, t->t->ne,
                                              fill_tensor, &ctx[i], err);
    }
    if (st == CORRAL_OK)
        st = w ? image_writer_write(w, out_path, err) : gguf_builder_write(b, out_path, err);
    if (w)
        image_writer_destroy(&w);
    else
        gguf_builder_destroy(&b);
    free(ctx);
    if (st == CORRAL_OK && out) {
        st = fill_result(p, ts, n, n_fallback, out, err);
        out->seconds = now_seconds() - t0;
    }
    free(ts);
    return st;
}

corral_status quantize_file(const char *in_path, const char *out_path,
                            const quantize_params *params, quantize_result *out,
                            corral_error *err) {
    if (!in_path || !out_path || !params)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "quantize_file: NULL argument");
    image_file_stamp a, b;
    if (image_file_stamp_read(in_path, &a, NULL) == CORRAL_OK &&
        image_file_stamp_read(out_path, &b, NULL) == CORRAL_OK && a.dev == b.dev && a.ino == b.ino)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "input and output are the same file: %s", in_path);
    gguf_file *in = gguf_open(in_path, err);
    if (!in) return err ? err->status : CORRAL_IO;
    corral_status st = quantize_write(in, out_path, params, out, err);
    gguf_destroy(&in);
    return st;
}
