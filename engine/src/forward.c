/*
 * forward.c — the forward pass of the llama-style decoder, and the matrix product under it.
 *
 * Per batch of tokens at positions p0..p0+n-1:
 *   x = embed(tokens)
 *   for each layer:
 *     xn = rms_norm(x) * attn_norm
 *     q, k, v = Wq xn (+bq), Wk xn (+bk), Wv xn (+bv); rotate q and k; store k, v at their
 * positions attn[h] = softmax(q[h] . K[0..p, kv(h)] / sqrt(head_dim)) . V[0..p, kv(h)]   (causal,
 * GQA) x += Wo attn xn = rms_norm(x) * ffn_norm x += Wdown (silu(Wgate xn) * Wup xn) The output
 * norm and projection are applied by model_forward to the tokens whose logits are wanted.
 *
 * Matrix products come in two modes. FAST quantizes the activations once per batch to the
 * weight's partner type and uses the type's dot kernel, like llama.cpp. REFERENCE dequantizes each
 * weight row to F32 and accumulates in double: no activation is ever rounded.
 *
 * Threads. The activations of a matrix product are quantized first, split by token rows over the
 * runner's pool (by the calling thread alone for a token or two); then each thread computes a
 * contiguous range of the weight's rows for every token. Attention splits the (head, token) pairs.
 * These are threadpool_run_slices runs: a slice whose thread is not running yet (a busy machine)
 * is done by the caller instead of waited for. No output element is computed by two threads or in
 * a thread-dependent order, so the results do not depend on the thread count.
 *
 * Kernels. Dot products, activation quantizers, the attention loops and the row ops come from the
 * runner's kernel table, r->ops (kernels.h): the best SIMD path of the CPU, or CORRAL_CPU's
 * choice; reference mode keeps the scalar ones.
 */
#include <math.h>
#include <string.h>

#include "model_impl.h"

/* 1 when x[n_tok][n_in] (at the runner's current epoch) is already in r->act_q[t]. */
static int act_is_quantized(const struct model_runner *r, const float *x, int64_t n_tok,
                            int64_t n_in, tensor_type t) {
    const act_cache_entry *c = &r->act_cached[t];
    return c->src == x && c->epoch == r->epoch && c->n_tok == n_tok && c->n_in == n_in;
}

/* Quantize activation rows [i0, i1) of x[][n_in] into r->act_q[t]. */
static void act_quantize_rows(struct model_runner *r, const float *x, int64_t i0, int64_t i1,
                              int64_t n_in, tensor_type t) {
    const tensor_from_float_fn quantize = r->ops->type[t].from_float;
    const size_t row = tensor_row_size(t, n_in);
    for (int64_t i = i0; i < i1; i++) quantize(x + i * n_in, (char *)r->act_q[t] + i * row, n_in);
}

/* The part [i * n / nth, (i + 1) * n / nth) of n items that thread i of nth takes. */
static inline int64_t split_begin(int64_t n, uint32_t i, uint32_t nth) {
    return n * (int64_t)i / (int64_t)nth;
}

/* Batches of at least this many tokens have their activations quantized by all threads, in a run
 * of its own; shorter ones, as in decoding, by the calling thread, since a run costs more than
 * quantizing a row or two. */
#define FORWARD_PARALLEL_QUANTIZE_MIN_TOKENS 8

/* One matrix product as a pool run (see forward_matmul). */
typedef struct matmul_task {
    struct model_runner *r;
    float *out;
    const model_weight *w;
    const float *x;
    int64_t n_tok;
    tensor_type vt; /* the weight's partner type (FAST mode) */
    const void *xq; /* x in vt's layout (FAST mode) */
} matmul_task;

/* out[t][row] for rows [row0, row1) of W and every token; ith picks the thread's scratch. */
static void matmul_rows(struct model_runner *r, const matmul_task *task, int64_t row0, int64_t row1,
                        uint32_t ith) {
    float *out = task->out;
    const model_weight *w = task->w;
    const float *x = task->x;
    const int64_t n_tok = task->n_tok;
    const int64_t n_in = w->n_in, n_out = w->n_out;
    if (r->m->params.compute == MODEL_COMPUTE_REFERENCE) {
        float *row_f32 = r->row_f32 + (size_t)ith * r->max_in;
        for (int64_t row = row0; row < row1; row++) {
            const void *src = (const char *)w->data + row * w->row_bytes;
            if (w->type == TENSOR_TYPE_F32)
                memcpy(row_f32, src, (size_t)n_in * sizeof(float));
            else
                w->traits->to_float(src, row_f32, n_in);
            for (int64_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * n_in;
                double sum = 0.0;
                for (int64_t i = 0; i < n_in; i++) sum += (double)row_f32[i] * (double)xt[i];
                out[t * n_out + row] = (float)sum;
            }
        }
        return;
    }
    const void *xq = task->xq;
    const size_t xq_row = tensor_row_size(task->vt, n_in);
    const tensor_vec_dot_fn vec_dot = r->ops->type[w->type].vec_dot;
    /* Weight rows outermost: each row is read from memory once per batch. */
    for (int64_t row = row0; row < row1; row++) {
        const void *wrow = (const char *)w->data + row * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++)
            vec_dot(n_in, &out[t * n_out + row], wrow, (const char *)xq + t * xq_row);
    }
}

static void quantize_thread(void *arg, uint32_t ith, uint32_t nth) {
    const matmul_task *task = arg;
    act_quantize_rows(task->r, task->x, split_begin(task->n_tok, ith, nth),
                      split_begin(task->n_tok, ith + 1, nth), task->w->n_in, task->vt);
}

static void matmul_thread(void *arg, uint32_t ith, uint32_t nth) {
    const matmul_task *task = arg;
    const int64_t n_out = task->w->n_out;
    matmul_rows(task->r, task, split_begin(n_out, ith, nth), split_begin(n_out, ith + 1, nth), ith);
}

void forward_matmul(struct model_runner *r, float *out, const model_weight *w, const float *x,
                    int64_t n_tok) {
    matmul_task task = {.r = r, .out = out, .w = w, .x = x, .n_tok = n_tok};
    if (r->m->params.compute != MODEL_COMPUTE_REFERENCE) {
        task.vt = w->traits->vec_dot_type;
        task.xq = task.vt == TENSOR_TYPE_F32 ? (const void *)x : r->act_q[task.vt];
        if (task.vt != TENSOR_TYPE_F32 && !act_is_quantized(r, x, n_tok, w->n_in, task.vt)) {
            if (n_tok >= FORWARD_PARALLEL_QUANTIZE_MIN_TOKENS)
                threadpool_run_slices(r->pool, quantize_thread, &task);
            else
                act_quantize_rows(r, x, 0, n_tok, w->n_in, task.vt);
            r->act_cached[task.vt] =
                (act_cache_entry){.src = x, .epoch = r->epoch, .n_tok = n_tok, .n_in = w->n_in};
        }
    }
    threadpool_run_slices(r->pool, matmul_thread, &task);
}

void forward_get_row(const struct model_runner *r, const model_weight *w, int64_t row, float *dst) {
    const void *src = (const char *)w->data + row * w->row_bytes;
    if (w->type == TENSOR_TYPE_F32)
        memcpy(dst, src, (size_t)w->n_in * sizeof(float));
    else
        r->ops->type[w->type].to_float(src, dst, w->n_in);
}

/* Pointer to the K or V row of (layer, pos). */
static inline void *kv_row_ptr(const struct kv_cache *kv, void *base, uint32_t il, uint32_t pos) {
    return (char *)base + (((size_t)il * kv->n_ctx + pos) * kv->row_elems) * kv->elem_size;
}

static void kv_store(struct kv_cache *kv, void *base, uint32_t il, uint32_t pos, const float *src) {
    void *dst = kv_row_ptr(kv, base, il, pos);
    if (kv->type == KV_TYPE_F32) {
        memcpy(dst, src, kv->row_elems * sizeof(float));
    } else {
        uint16_t *h = dst;
        for (size_t i = 0; i < kv->row_elems; i++) h[i] = tensor_f32_to_fp16(src[i]);
    }
}

/* The head_dim elements of kv head `kvh` at (layer, pos), F32 or F16 as the cache holds them. */
static inline const void *kv_head(const struct kv_cache *kv, void *base, uint32_t il, uint32_t pos,
                                  uint32_t kvh, uint32_t head_dim) {
    return (const char *)kv_row_ptr(kv, base, il, pos) + (size_t)kvh * head_dim * kv->elem_size;
}

/* Causal grouped-query attention of one token at position `pos` for layer il, heads [h0, h1),
 * with thread ith's scratch. */
static void attend(struct model_runner *r, struct kv_cache *kv, uint32_t il, uint32_t pos,
                   const float *q, float *out, uint32_t h0, uint32_t h1, uint32_t ith) {
    const model_hparams *hp = &r->m->hp;
    const uint32_t hd = hp->head_dim;
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = r->scores + (size_t)ith * hp->n_ctx_train;
    const kernel_ops *ops = r->ops;
    const int f16 = kv->type == KV_TYPE_F16;
    for (uint32_t h = h0; h < h1; h++) {
        const uint32_t kvh = h / group;
        const float *qh = q + (size_t)h * hd;
        for (uint32_t p = 0; p <= pos; p++) {
            const void *kh = kv_head(kv, kv->k, il, p, kvh, hd);
            const float dot = f16 ? ops->attn_dot_f16(qh, kh, hd) : ops->attn_dot_f32(qh, kh, hd);
            scores[p] = dot * scale;
        }
        ops->softmax(scores, pos + 1);
        float *oh = out + (size_t)h * hd;
        memset(oh, 0, hd * sizeof(float));
        for (uint32_t p = 0; p <= pos; p++) {
            const void *vh = kv_head(kv, kv->v, il, p, kvh, hd);
            if (f16)
                ops->attn_axpy_f16(oh, scores[p], vh, hd);
            else
                ops->attn_axpy_f32(oh, scores[p], vh, hd);
        }
    }
}

/* Attention of a batch as a pool run: the (head, token) pairs, head-major, split into contiguous
 * ranges. Head-major keeps the threads' shares even in a prefill, where later tokens attend to
 * more positions. */
typedef struct attend_task {
    struct model_runner *r;
    struct kv_cache *kv;
    uint32_t il, p0, n_tok;
} attend_task;

static void attend_thread(void *arg, uint32_t ith, uint32_t nth) {
    const attend_task *task = arg;
    struct model_runner *r = task->r;
    const model_hparams *hp = &r->m->hp;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_pairs = (int64_t)hp->n_head * task->n_tok;
    const int64_t end = split_begin(n_pairs, ith + 1, nth);
    for (int64_t i = split_begin(n_pairs, ith, nth); i < end; i++) {
        const uint32_t h = (uint32_t)(i / task->n_tok), t = (uint32_t)(i % task->n_tok);
        attend(r, task->kv, task->il, task->p0 + t, r->q + t * n_q, r->attn + t * n_q, h, h + 1,
               ith);
    }
}

static void add_bias(float *y, const model_weight *b, int64_t n_tok) {
    if (!b->data) return;
    for (int64_t t = 0; t < n_tok; t++) ops_add(y + t * b->n_in, b->data, b->n_in);
}

void forward_decoder(struct model_runner *r, struct kv_cache *kv, const int32_t *tokens,
                     uint32_t n_tok) {
    const struct model *m = r->m;
    const model_hparams *hp = &m->hp;
    const int64_t n_embd = hp->n_embd, n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_kv = (int64_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff;
    const uint32_t p0 = kv->n_pos;

    for (uint32_t t = 0; t < n_tok; t++)
        forward_get_row(r, &m->global[ARCH_ROLE_TOKEN_EMBD], tokens[t], r->x + t * n_embd);
    for (uint32_t t = 0; t < n_tok; t++)
        ops_rope_cache(&m->rope, (int32_t)(p0 + t), r->rope_cs + (size_t)t * hp->n_rot);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        /* Attention. */
        const model_weight *attn_norm = model_layer_weight(m, il, ARCH_ROLE_ATTN_NORM);
        for (uint32_t t = 0; t < n_tok; t++)
            r->ops->rms_norm(r->xn + t * n_embd, r->x + t * n_embd, attn_norm->data, n_embd,
                             hp->rms_eps);
        r->epoch++;
        forward_matmul(r, r->q, model_layer_weight(m, il, ARCH_ROLE_ATTN_Q), r->xn, n_tok);
        forward_matmul(r, r->k, model_layer_weight(m, il, ARCH_ROLE_ATTN_K), r->xn, n_tok);
        forward_matmul(r, r->v, model_layer_weight(m, il, ARCH_ROLE_ATTN_V), r->xn, n_tok);
        add_bias(r->q, model_layer_weight(m, il, ARCH_ROLE_ATTN_Q_BIAS), n_tok);
        add_bias(r->k, model_layer_weight(m, il, ARCH_ROLE_ATTN_K_BIAS), n_tok);
        add_bias(r->v, model_layer_weight(m, il, ARCH_ROLE_ATTN_V_BIAS), n_tok);
        for (uint32_t t = 0; t < n_tok; t++) {
            const float *cs = r->rope_cs + (size_t)t * hp->n_rot;
            ops_rope_apply(&m->rope, r->q + t * n_q, (int32_t)hp->n_head, (int32_t)hp->head_dim,
                           cs);
            ops_rope_apply(&m->rope, r->k + t * n_kv, (int32_t)hp->n_head_kv, (int32_t)hp->head_dim,
                           cs);
            kv_store(kv, kv->k, il, p0 + t, r->k + t * n_kv);
            kv_store(kv, kv->v, il, p0 + t, r->v + t * n_kv);
        }
        attend_task at = {.r = r, .kv = kv, .il = il, .p0 = p0, .n_tok = n_tok};
        threadpool_run_slices(r->pool, attend_thread, &at);
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_ATTN_OUT), r->attn, n_tok);
        ops_add(r->x, r->tmp, n_tok * n_embd);

        /* Feed-forward. */
        const model_weight *ffn_norm = model_layer_weight(m, il, ARCH_ROLE_FFN_NORM);
        for (uint32_t t = 0; t < n_tok; t++)
            r->ops->rms_norm(r->xn + t * n_embd, r->x + t * n_embd, ffn_norm->data, n_embd,
                             hp->rms_eps);
        r->epoch++;
        forward_matmul(r, r->gate, model_layer_weight(m, il, ARCH_ROLE_FFN_GATE), r->xn, n_tok);
        forward_matmul(r, r->up, model_layer_weight(m, il, ARCH_ROLE_FFN_UP), r->xn, n_tok);
        r->ops->swiglu(r->gate, r->up, n_tok * n_ff);
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_FFN_DOWN), r->gate, n_tok);
        ops_add(r->x, r->tmp, n_tok * n_embd);
    }
    kv->n_pos = p0 + n_tok;
}
