/*
 * model_impl.h — the structs behind model.h's opaque handles (private to the engine).
 */
#ifndef CORRAL_ENGINE_MODEL_IMPL_H
#define CORRAL_ENGINE_MODEL_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "arch.h"
#include "corral/image.h"
#include "corral/model.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "kernels.h"
#include "ops.h"

/* One weight matrix (or vector) bound from the file: rows of n_in elements of `type`. */
typedef struct model_weight {
    const void *data;      /* into the file mapping (or the repacked copy); NULL when the (optional)
                              tensor is absent */
    const void *file_data; /* into the file mapping, always (data before any repacking) */
    uint32_t type;
    int64_t n_in;     /* ne[0]: elements per row */
    int64_t n_out;    /* ne[1]: rows (1 for vectors) */
    size_t row_bytes; /* bytes per row */
    const tensor_type_traits *traits;
    /* 1 when data holds the rows in panel layout (kernels.h): n_out / 16 panels, then the rows
     * left over as in the file. Only for types with a panel kernel on the runner's path. */
    int panels;
    /* The file's tensor the weight is, or a view of (a fused tensor's part: rows [row0,
     * row0 + n_out) of it); NULL when absent. */
    const gguf_tensor *tensor;
    int64_t row0;
} model_weight;

struct model {
    gguf_file *file;
    const arch_desc *arch;
    model_hparams hp;
    model_params params;
    tokenizer *tok;
    rope_params rope;     /* the full-attention layers' rotation */
    rope_params rope_swa; /* the sliding layers' (their own base, never scaled) */
    uint8_t *layer_swa;   /* [n_layer]: 1 for a sliding layer */
    uint32_t *swa_before; /* [n_layer]: how many sliding layers come before each (KV layout) */
    model_weight global[ARCH_N_GLOBAL_ROLES];
    model_weight *layers; /* [n_layer][ARCH_N_LAYER_ROLES] */
    uint64_t weight_bytes;
    /* The weights in panel layout (model_repack.c): a mapped image in the cache directory, or
     * memory of our own when there is no cache directory; NULL when nothing was repacked. */
    struct model_packed *packed;
    /* model_weights_release: the weights are not in memory (packed is NULL, data points into the
     * file mapping, whose pages were given back) until model_weights_restore. */
    int released;
    /* The file's stamp at load (image.h): a restore, and model_file_check, compare the file
     * with it. */
    image_file_stamp file_id;
    /* image_fingerprint_add_file of the file at load, in the domain "corral-model-file-1" (16 hex
     * digits), or "" when the file could not be read for it. */
    char file_fingerprint[IMAGE_FINGERPRINT_CHARS + 1];
    /* The weights failed under a reader (SIGBUS: a mapped file truncated or unreadable): set once,
     * by the thread that caught it, after fault_message (model_note_fault). The one part of a
     * loaded model that changes: it is read and written through const pointers. */
    atomic_int faulted;
    char fault_message[CORRAL_ERROR_MESSAGE_MAX];
};

/* The weight slots of a model: the global ones, then every layer's. */
static inline size_t model_n_slots(const struct model *m) {
    return ARCH_N_GLOBAL_ROLES + (size_t)m->hp.n_layer * ARCH_N_LAYER_ROLES;
}

static inline const model_weight *model_slot_at(const struct model *m, size_t i) {
    return i < ARCH_N_GLOBAL_ROLES ? &m->global[i] : &m->layers[i - ARCH_N_GLOBAL_ROLES];
}

static inline model_weight *model_slot(struct model *m, size_t i) {
    return (model_weight *)model_slot_at(m, i);
}

/* The weight of a per-layer role in layer il. */
static inline const model_weight *model_layer_weight(const struct model *m, uint32_t il,
                                                     arch_role role) {
    return &m->layers[(size_t)il * ARCH_N_LAYER_ROLES + (role - ARCH_ROLE_FIRST_LAYER_ROLE)];
}

struct kv_cache {
    const struct model *m;
    kv_type type;
    uint32_t n_ctx;
    uint32_t n_pos;
    size_t elem_size; /* 2 (F16) or 4 (F32) */
    uint32_t n_head_kv;
    uint32_t head_dim;
    /* Rows per KV head of a sliding layer (min(n_ctx, n_swa + KV_WINDOW_SLACK)); n_ctx when the
     * model has none. */
    uint32_t swa_rows;
    /* The position in a sliding layer's row 0: rows hold positions [swa_base, n_pos). A pass that
     * would write past the last row first moves the window of its first position to the front
     * (kv__window_make_room), so the rows a query reads are always contiguous and in order. */
    uint32_t swa_base;
    /* Tokens of this cache one pass may take: swa_rows - n_swa + 1 when the rows may have to
     * move, else no limit (UINT32_MAX). */
    uint32_t pass_max;
    /* For each layer in order, [n_head_kv][rows][head_dim] (rows: n_ctx, or swa_rows for a
     * sliding layer): one KV head's rows are contiguous, so attention streams them instead of
     * reading a head's part of every position's row. */
    void *k;
    void *v;
    /* The model_forward_batch call that last checked this cache (a number unique in the process),
     * which finds the same cache given twice in one call without a search. */
    uint64_t batch_call;
    /* n_pos when that call began: a call cut short by a fault puts it back. */
    uint32_t n_pos_at_call;
};

/* The rows per KV head a cache keeps for layer il. */
static inline uint32_t kv_layer_rows(const struct kv_cache *kv, uint32_t il) {
    return kv->m->layer_swa[il] ? kv->swa_rows : kv->n_ctx;
}

/* The position of layer il's row 0. */
static inline uint32_t kv_layer_base(const struct kv_cache *kv, uint32_t il) {
    return kv->m->layer_swa[il] ? kv->swa_base : 0;
}

/* The row of (layer, KV head, position) in base (kv->k or kv->v); pos must be held (at least
 * the layer's base). */
static inline void *kv_cache_row(const struct kv_cache *kv, void *base, uint32_t il, uint32_t kvh,
                                 uint32_t pos) {
    /* The layers before il: swa_before[il] sliding ones, the others full. */
    const size_t swa = kv->m->swa_before[il], full = il - swa;
    const size_t layer0 = kv->n_head_kv * (full * kv->n_ctx + swa * kv->swa_rows);
    const size_t row = layer0 + (size_t)kvh * kv_layer_rows(kv, il) + (pos - kv_layer_base(kv, il));
    return (char *)base + row * kv->head_dim * kv->elem_size;
}

/* Make room in the sliding layers for positions [first, last] of a pass, first being the
 * cache's n_pos: when last would fall past the rows, the rows of first's window move to the
 * front (memmove) and swa_base follows. last - first < pass_max. */
void kv__window_make_room(struct kv_cache *kv, uint32_t first, uint32_t last);

/* Activations quantized to a weight's partner type are cached per type until the source buffer
 * changes (the forward pass bumps `epoch` whenever it rewrites a matmul input). */
typedef struct act_cache_entry {
    const float *src;
    uint64_t epoch;
    int64_t n_tok, n_in;
} act_cache_entry;

struct model_runner {
    const struct model *m;
    uint32_t max_batch;
    threadpool *pool;   /* borrowed; NULL: single-threaded */
    uint32_t n_threads; /* threadpool_n_threads(pool): the per-thread scratch below has this many */
    size_t max_in;      /* longest matmul input row: the stride of row_f32 */
    /* The CPU kernels: kernels_get(), or the scalar ones in reference mode. */
    const kernel_ops *ops;
    /* Activations, [max_batch][dim]. */
    float *x;           /* residual stream [n_embd] */
    float *xn;          /* normed input of attention / ffn [n_embd] */
    float *q;           /* [n_q] */
    float *k;           /* [n_kv] */
    float *v;           /* [n_kv] */
    float *attn;        /* attention output [n_q] */
    float *tmp;         /* output of a projection [n_embd] */
    float *gate;        /* [n_ff] */
    float *up;          /* [n_ff] */
    float *scores;      /* attention scores over the context, per thread and head of a kernel call
                           [n_threads][KERNEL_ATTN_MAX_HEADS][n_ctx_train] */
    float *rope_cs;     /* cos/sin per token [max_batch][n_rot] */
    float *rope_cs_swa; /* the same for the sliding layers' rotation (NULL without them) */
    float *row_f32; /* a dequantized weight row (reference mode), per thread [n_threads][max_in] */
    float *kv_row;  /* a K or V row converted to F32, per thread [n_threads][head_dim] */
    void *row_q;    /* one weight row in file layout, taken out of a panel (forward_get_row) */
    /* Quantized activations, one buffer per partner type. */
    void *act_q[TENSOR_TYPE_COUNT];
    size_t act_q_size[TENSOR_TYPE_COUNT];
    act_cache_entry act_cached[TENSOR_TYPE_COUNT];
    /* Side data of the Q8_0 activations for the panel kernels, [max_batch][max_in / 32]. */
    kernel_act_aux *act_aux;
    /* The F16 activations widened to float for the F16 panel kernel, [max_batch][max_in]; only
     * when the model has F16 panels. */
    float *act_f16_f32;
    uint64_t epoch;
    /* The batch of a pass (forward_batch), [max_batch] each: every token's id, its sequence's
     * cache and its position there. */
    int32_t *tok_id;
    struct kv_cache **tok_kv;
    uint32_t *tok_pos;
    /* The tokens of a pass whose logits are wanted (each a sequence's last) and where each
     * sequence wants them, [max_batch] each. */
    uint32_t *out_tok;
    float **out_row;
    /* Per thread, a tile of panel-kernel outputs on their way to scattered rows (a matrix product
     * whose tokens write to rows of their own: the logits of a batch of sequences),
     * [n_threads][FORWARD_SCATTER_TOKENS * FORWARD_SCATTER_PANELS * KERNEL_PANEL_ROWS]. */
    float *scatter;
    /* model_runner_set_observer: called before every matrix product (NULL: none). */
    model_matmul_observer observer;
    void *observer_user;
};

/* The tile of forward_matmul_rows' panel outputs, in tokens and panels (runner->scatter). */
#define FORWARD_SCATTER_TOKENS 16
#define FORWARD_SCATTER_PANELS 16

/* Put the weights the path has panel kernels for into panel layout (model_repack.c); a no-op in
 * reference mode or with keep_file_layout. CORRAL_OUT_OF_MEMORY with err set when the copy
 * cannot be made. */
corral_status model__repack(struct model *m, corral_error *err);

/* Point every repacked weight back at the file's copy and free or unmap the panels (the inverse
 * of model__repack; model_weights_release). */
void model__unpack(struct model *m);

/* Let every weight that is the file's tensor `t` (or a view of its rows) read `data` instead:
 * the whole tensor's rows in `type` (same shape; e.g. the tensor quantized, to measure what that
 * does to the logits: quantize_probe.c). data NULL: the file's bytes again. Only for a model
 * loaded with keep_file_layout (no weight in panels), and with no runner alive meanwhile: a
 * runner sizes its scratch for the weights' types when it is made. */
void model__substitute_tensor(struct model *m, const gguf_tensor *t, tensor_type type,
                              const void *data);

/* Map the file pages of [p, p + n) into the process now (MADV_POPULATE_READ where the kernel has
 * it; otherwise nothing): weights about to be read in full (model_repack.c). */
void model__populate(const void *p, size_t n);

/* The repacked weights' image (its mapping), or NULL when none is mapped. */
const gguf_file *model__packed_gguf(const struct model *m);

/* Release what model__repack made. NULL-safe; sets *p to NULL. */
void model__packed_destroy(struct model_packed **p);

/* The llama-style decoder (forward.c): an arch_forward_fn. */
void forward_decoder(struct model_runner *r, const forward_batch *b);

/* out[t][row] = W[row] . x[t] for t < n_tok, rows of W, split over the runner's pool
 * (forward.c). */
void forward_matmul(struct model_runner *r, float *out, const model_weight *w, const float *x,
                    int64_t n_tok);

/* The same with token t's outputs at out_rows[t] (n_out floats each), rows that need not be
 * spaced evenly: the output projection of a batch of sequences, into each one's logits. The same
 * bits as forward_matmul. */
void forward_matmul_rows(struct model_runner *r, float *const *out_rows, const model_weight *w,
                         const float *x, int64_t n_tok);

/* Up to FORWARD_MAX_GROUP products of the same input in one pool run: out[i] = W[i] x (Q, K and
 * V; gate and up). */
#define FORWARD_MAX_GROUP 3
void forward_matmul_group(struct model_runner *r, int n, float *const *out,
                          const model_weight *const *w, const float *x, int64_t n_tok);

/* Dequantize row `row` of an embedding-like weight into dst (forward.c). */
void forward_get_row(const struct model_runner *r, const model_weight *w, int64_t row, float *dst);

#endif /* CORRAL_ENGINE_MODEL_IMPL_H */
