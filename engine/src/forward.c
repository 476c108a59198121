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
 */
#include <math.h>
#include <string.h>

#include "model_impl.h"

/* The activations x[n_tok][n_in] in type t's layout, quantizing them if this (buffer, epoch) has
 * not been quantized to t yet. */
static const void *act_quantized(struct model_runner *r, const float *x, int64_t n_tok,
                                 int64_t n_in, tensor_type t) {
    if (t == TENSOR_TYPE_F32) return x;
    act_cache_entry *c = &r->act_cached[t];
    if (c->src == x && c->epoch == r->epoch && c->n_tok == n_tok && c->n_in == n_in)
        return r->act_q[t];
    const tensor_type_traits *tt = tensor_type_get_traits(t);
    const size_t row = tensor_row_size(t, n_in);
    for (int64_t i = 0; i < n_tok; i++)
        tt->from_float(x + i * n_in, (char *)r->act_q[t] + i * row, n_in);
    *c = (act_cache_entry){.src = x, .epoch = r->epoch, .n_tok = n_tok, .n_in = n_in};
    return r->act_q[t];
}

void forward_matmul(struct model_runner *r, float *out, const model_weight *w, const float *x,
                    int64_t n_tok) {
    const int64_t n_in = w->n_in, n_out = w->n_out;
    if (r->m->params.compute == MODEL_COMPUTE_REFERENCE) {
        for (int64_t row = 0; row < n_out; row++) {
            const void *src = (const char *)w->data + row * w->row_bytes;
            if (w->type == TENSOR_TYPE_F32)
                memcpy(r->row_f32, src, (size_t)n_in * sizeof(float));
            else
                w->traits->to_float(src, r->row_f32, n_in);
            for (int64_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * n_in;
                double sum = 0.0;
                for (int64_t i = 0; i < n_in; i++) sum += (double)r->row_f32[i] * (double)xt[i];
                out[t * n_out + row] = (float)sum;
            }
        }
        return;
    }
    const tensor_type vt = w->traits->vec_dot_type;
    const void *xq = act_quantized(r, x, n_tok, n_in, vt);
    const size_t xq_row = tensor_row_size(vt, n_in);
    /* Weight rows outermost: each row is read from memory once per batch. */
    for (int64_t row = 0; row < n_out; row++) {
        const void *wrow = (const char *)w->data + row * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++)
            w->traits->vec_dot(n_in, &out[t * n_out + row], wrow, (const char *)xq + t * xq_row);
    }
}

void forward_get_row(const model_weight *w, int64_t row, float *dst) {
    const void *src = (const char *)w->data + row * w->row_bytes;
    if (w->type == TENSOR_TYPE_F32)
        memcpy(dst, src, (size_t)w->n_in * sizeof(float));
    else
        w->traits->to_float(src, dst, w->n_in);
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

/* The head_dim floats of kv head `kvh` at (layer, pos), as F32 (converted into r->kv_row when
 * the cache holds F16). */
static inline const float *kv_head(struct model_runner *r, const struct kv_cache *kv, void *base,
                                   uint32_t il, uint32_t pos, uint32_t kvh, uint32_t head_dim) {
    const void *row = kv_row_ptr(kv, base, il, pos);
    if (kv->type == KV_TYPE_F32) return (const float *)row + (size_t)kvh * head_dim;
    const uint16_t *h = (const uint16_t *)row + (size_t)kvh * head_dim;
    for (uint32_t i = 0; i < head_dim; i++) r->kv_row[i] = tensor_fp16_to_f32(h[i]);
    return r->kv_row;
}

/* Causal grouped-query attention of one token at position `pos` for layer il. */
static void attend(struct model_runner *r, struct kv_cache *kv, uint32_t il, uint32_t pos,
                   const float *q, float *out) {
    const model_hparams *hp = &r->m->hp;
    const uint32_t hd = hp->head_dim;
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = 0; h < hp->n_head; h++) {
        const uint32_t kvh = h / group;
        const float *qh = q + (size_t)h * hd;
        for (uint32_t p = 0; p <= pos; p++) {
            const float *kh = kv_head(r, kv, kv->k, il, p, kvh, hd);
            float dot = 0.0f;
            for (uint32_t i = 0; i < hd; i++) dot += qh[i] * kh[i];
            r->scores[p] = dot * scale;
        }
        ops_softmax(r->scores, pos + 1);
        float *oh = out + (size_t)h * hd;
        memset(oh, 0, hd * sizeof(float));
        for (uint32_t p = 0; p <= pos; p++) {
            const float *vh = kv_head(r, kv, kv->v, il, p, kvh, hd);
            const float a = r->scores[p];
            for (uint32_t i = 0; i < hd; i++) oh[i] += a * vh[i];
        }
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
        forward_get_row(&m->global[ARCH_ROLE_TOKEN_EMBD], tokens[t], r->x + t * n_embd);
    for (uint32_t t = 0; t < n_tok; t++)
        ops_rope_cache(&m->rope, (int32_t)(p0 + t), r->rope_cs + (size_t)t * hp->n_rot);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        /* Attention. */
        const model_weight *attn_norm = model_layer_weight(m, il, ARCH_ROLE_ATTN_NORM);
        for (uint32_t t = 0; t < n_tok; t++)
            ops_rms_norm(r->xn + t * n_embd, r->x + t * n_embd, attn_norm->data, n_embd,
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
        for (uint32_t t = 0; t < n_tok; t++)
            attend(r, kv, il, p0 + t, r->q + t * n_q, r->attn + t * n_q);
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_ATTN_OUT), r->attn, n_tok);
        ops_add(r->x, r->tmp, n_tok * n_embd);

        /* Feed-forward. */
        const model_weight *ffn_norm = model_layer_weight(m, il, ARCH_ROLE_FFN_NORM);
        for (uint32_t t = 0; t < n_tok; t++)
            ops_rms_norm(r->xn + t * n_embd, r->x + t * n_embd, ffn_norm->data, n_embd,
                         hp->rms_eps);
        r->epoch++;
        forward_matmul(r, r->gate, model_layer_weight(m, il, ARCH_ROLE_FFN_GATE), r->xn, n_tok);
        forward_matmul(r, r->up, model_layer_weight(m, il, ARCH_ROLE_FFN_UP), r->xn, n_tok);
        ops_swiglu(r->gate, r->up, n_tok * n_ff);
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_FFN_DOWN), r->gate, n_tok);
        ops_add(r->x, r->tmp, n_tok * n_embd);
    }
    kv->n_pos = p0 + n_tok;
}
