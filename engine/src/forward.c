/*
 * forward.c — the forward pass of the llama-style decoder, and the matrix product under it.
 *
 * A pass runs a batch (forward_batch, arch.h): up to max_batch tokens, each with its sequence's
 * KV cache and its position in it. One sequence's tokens are consecutive (a prompt chunk, or a
 * single decode token), and a batch may hold the tokens of many sequences (continuous batching:
 * model_forward_batch). For token t of sequence s at position p_t:
 *   x = embed(tokens) (* sqrt(n_embd) for gemma)
 *   for each layer:
 *     xn = rms_norm(x) * attn_norm
 *     q, k, v = Wq xn (+bq), Wk xn (+bk), Wv xn (+bv) (views of one fused Wqkv for phi3);
 *       each head of q and k rms_norm'ed (qwen3, gemma3); rotate q and k by each token's own
 *       position (a sliding layer with its own RoPE base); store k, v at p_t in s's cache
 *     attn[h] = softmax(q[h] . K_s[w..p_t, kv(h)] * scale) . V_s[w..p_t, kv(h)]
 *       (causal, GQA; over s's cache alone, the batch's earlier tokens of s included; w is 0,
 *       or p_t - n_swa + 1 in a sliding-window layer; scale 1/sqrt(head_dim) as a rule)
 *     x += Wo attn (rms_norm'ed first * post_attention_norm for gemma3)
 *     xn = rms_norm(x) * ffn_norm
 *     x += Wdown (act(Wgate xn) * Wup xn) (act SiLU, or GELU-tanh for gemma; rms_norm'ed first
 *       * post_ffw_norm for gemma3)
 * Which of these a model does is its architecture's row in arch.c and the tensors it binds.
 * The matrix products take the whole batch as one matrix, whichever sequences its rows belong to,
 * so the weights are read once per pass for all of them; everything else is per token (the row
 * ops) or per token against its own sequence's cache (attention), so a token's results do not
 * depend on the other sequences of the batch. The output norm and projection are applied by
 * model.c to the tokens whose logits are wanted (one product for all of them:
 * forward_matmul_rows writes each sequence's row wherever the caller keeps it).
 *
 * Matrix products come in two modes. FAST quantizes the activations once per batch to the
 * weight's partner type, like llama.cpp, and multiplies with the panel kernels where the weight
 * is in panel layout (kernels.h; model_repack.c puts it there at load), else with the type's dot
 * kernel. REFERENCE dequantizes each weight row to F32 and accumulates in double: no activation
 * is ever rounded.
 *
 * Prefill is a matrix-matrix product: a panel kernel reads a block of 16 weight rows once and uses
 * it for a tile of up to 16 tokens, and the tokens are taken in chunks that stay in L2 while the
 * thread's panels stream past (matmul_thread). Decoding runs the same kernels with one token, or
 * with one token per sequence when several decode together: to the products that is a short
 * prefill, the weights read once for all of them.
 *
 * Threads. The activations of a matrix product are quantized first, split by token rows over the
 * runner's pool (by the calling thread alone for a short batch); then the threads claim ranges of
 * 16-row units of the weight (Q, K and V together, gate and up together: one pool run each): in a
 * prefill a few blocks per thread for every chunk of tokens, in decoding shrinking shares of the
 * units left, so a faster thread takes more of them. Attention
 * splits (head set, token) units; the row operations between the products (norms, rotations,
 * SwiGLU) split the tokens of a long batch. These are threadpool_run_slices runs: a slice whose
 * thread is not running yet (a busy machine) is done by the caller instead of waited for. No output
 * element is computed by two threads or in a thread-dependent order, and the panel kernels compute
 * each element exactly as the dot kernels' scalar twins do whatever the tile, so the results depend
 * neither on the thread count nor on how many tokens a batch holds.
 *
 * Kernels. Dot products, panel kernels, activation quantizers, the attention kernel and the row
 * ops come from the runner's kernel table, r->ops (kernels.h): the best SIMD path of the CPU, or
 * CORRAL_CPU's choice; reference mode keeps the scalar ones.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "model_impl.h"
#include "tensor_blocks.h"

/* 1 when x[n_tok][n_in] (at the runner's current epoch) is already in r->act_q[t]. */
static int act_is_quantized(const struct model_runner *r, const float *x, int64_t n_tok,
                            int64_t n_in, tensor_type t) {
    const act_cache_entry *c = &r->act_cached[t];
    return c->src == x && c->epoch == r->epoch && c->n_tok == n_tok && c->n_in == n_in;
}

/* Quantize activation rows [i0, i1) of x[][n_in] into r->act_q[t]. What the panel
 * kernels take besides comes with them: Q8_0 rows' side data (kernel_act_aux), F16 rows widened
 * to float. */
static void act_quantize_rows(struct model_runner *r, const float *x, int64_t i0, int64_t i1,
                              int64_t n_in, tensor_type t) {
    const tensor_from_float_fn quantize = r->ops->type[t].from_float;
    const size_t row = tensor_row_size(t, n_in);
    for (int64_t i = i0; i < i1; i++) {
        void *q = (char *)r->act_q[t] + i * row;
        quantize(x + i * n_in, q, n_in);
        if (t == TENSOR_TYPE_Q8_0 && r->act_aux)
            kernels_act_aux(q, n_in, r->act_aux + i * (n_in / QK8_0));
        if (t == TENSOR_TYPE_F16 && r->act_f16_f32)
            r->ops->type[TENSOR_TYPE_F16].to_float(q, r->act_f16_f32 + i * n_in, n_in);
    }
}

/* The part [i * n / nth, (i + 1) * n / nth) of n items that thread i of nth takes. */
static inline int64_t split_begin(int64_t n, uint32_t i, uint32_t nth) {
    return n * (int64_t)i / (int64_t)nth;
}

/* Batches of at least this many tokens have their activations quantized by all threads, in a run
 * of its own; shorter ones, as in decoding, by the calling thread, since a run costs more than
 * quantizing a row or two. */
#define FORWARD_PARALLEL_QUANTIZE_MIN_TOKENS 8

/* A matrix product's tokens are taken in chunks whose quantized activations take about this many
 * bytes, so that a chunk stays in the core's L2 cache while every panel of the thread's share
 * streams past it once. */
#define FORWARD_TOKEN_CHUNK_BYTES (192u * 1024u)

/* ... except that weights of more than a byte per element (Q8_0, F16) take chunks of at least
 * this many tokens: every chunk reads the weights from memory again, and for those, reading them
 * less often gains more than the activations lose by spilling from L2 into L3. Measured on Zen 5,
 * 2 threads, pp512 of TinyLlama-1.1B shapes: F16 (8 KiB a token widened) 16 tokens 119-126 tok/s,
 * 256: 145-151, 512: 149-155; Q8_0 80 tokens 254-276, 352: 280-288; while Q4_0 and Q4_K lose
 * 8-10% at 2 MiB chunks. */
#define FORWARD_HEAVY_WEIGHT_CHUNK_TOKENS 256

/* A batch of several chunks (prefill) has each chunk's units handed out in blocks, about this
 * many per thread (matmul_thread): enough for a faster thread to take over some of a slower one's
 * work, few enough that each block is a long stream for the hardware prefetchers. */
#define FORWARD_MATMUL_CLAIMS_PER_THREAD 3

/* A batch of one chunk (decoding) has its units claimed in shrinking pieces instead: each claim
 * takes the units left divided by the thread count, but at least this many. The first claims are
 * long streams (at one thread the whole product is one), and the last ones short, so the threads
 * finish close together. Measured against FORWARD_MATMUL_CLAIMS_PER_THREAD blocks (TinyLlama
 * shapes, tg64 on 2 threads, 6 rounds alternating, paired medians): Q4_0 x1.04-1.06, Q4_K_M x1.05,
 * Q8_0 x1.11, SmolLM2 Q4_0 x1.03, Q4_0 on one thread x1.04. A share of the units left over twice
 * the thread count lost 2-6 %; the least claim of 4, 8 or 16 units made no clear difference. */
#define FORWARD_MATMUL_MIN_CLAIM_UNITS 8

/*
 * A matrix product (or a group of them with the same input) as one pool run.
 *
 * The work is cut into units of KERNEL_PANEL_ROWS rows: a panel of a weight in panel layout, or
 * 16 rows of any other weight (and the rows after the last panel), done by the type's dot kernel
 * pair by pair. The units of all weights of the group, one after the other, are cut into blocks
 * that the threads claim chunk by chunk of tokens (matmul_thread); a thread runs every unit of its
 * block over the chunk, a weight's panels in one call of its panel kernel: the kernel
 * reads a panel once per chunk and reuses each weight block for a tile of tokens, or with few
 * tokens works on several panels at once (kernels_panel.inc); the chunk's activations stay in L2.
 * No output element depends on the unit, the chunk or the thread that computes it: the panel
 * kernels are bit-identical to the scalar dot, the dot kernels do a pair at a time, so the
 * logits are the same for any thread count, batch size and mix of sequences.
 */
typedef struct matmul_job {
    const model_weight *w;
    float *out;             /* token t's outputs at out + t * n_out ... */
    float *const *out_rows; /* ... or, when set, at out_rows[t] (forward_matmul_rows) */
    tensor_type vt;         /* the weight's partner type (FAST mode) */
    const void *xq;         /* x in vt's layout (FAST mode) */
    size_t xq_row;          /* bytes per token of xq */
    const void *py;     /* what the panel kernel takes for x: xq, or for F16 x widened to floats */
    size_t py_row;      /* bytes per token of py */
    int64_t n_units;    /* ceil(n_out / KERNEL_PANEL_ROWS) */
    int64_t first_unit; /* units of the jobs before this one */
} matmul_job;

typedef struct matmul_task {
    struct model_runner *r;
    const float *x;
    int64_t n_tok;
    int64_t chunk; /* tokens per chunk */
    int64_t n_units;
    int64_t block;         /* units per claim (several chunks) */
    int64_t n_blocks;      /* claims per chunk: ceil(n_units / block) */
    int64_t n_claims;      /* n_blocks * the number of chunks; 0: one chunk, shrinking claims */
    _Atomic int64_t claim; /* the next claim to hand out, or (one chunk) the next unit */
    matmul_job job[FORWARD_MAX_GROUP];
} matmul_task;

/* Where token t's outputs go. */
static inline float *matmul_out(const matmul_job *job, int64_t t) {
    return job->out_rows ? job->out_rows[t] : job->out + t * job->w->n_out;
}

/* out[t][row] for rows [row0, row1) of W and tokens [t0, t1), one pair at a time; ith picks
 * the thread's scratch. */
static void matmul_rows(struct model_runner *r, const matmul_task *task, const matmul_job *job,
                        int64_t row0, int64_t row1, int64_t t0, int64_t t1, uint32_t ith) {
    const model_weight *w = job->w;
    const float *x = task->x;
    const int64_t n_in = w->n_in;
    if (r->m->params.compute == MODEL_COMPUTE_REFERENCE) {
        float *row_f32 = r->row_f32 + (size_t)ith * r->max_in;
        for (int64_t row = row0; row < row1; row++) {
            const void *src = (const char *)w->data + row * w->row_bytes;
            if (w->type == TENSOR_TYPE_F32)
                memcpy(row_f32, src, (size_t)n_in * sizeof(float));
            else
                w->traits->to_float(src, row_f32, n_in);
            for (int64_t t = t0; t < t1; t++) {
                const float *xt = x + t * n_in;
                double sum = 0.0;
                for (int64_t i = 0; i < n_in; i++) sum += (double)row_f32[i] * (double)xt[i];
                matmul_out(job, t)[row] = (float)sum;
            }
        }
        return;
    }
    const tensor_vec_dot_fn vec_dot = r->ops->type[w->type].vec_dot;
    /* Weight rows outermost: each row is read from memory once per chunk. */
    for (int64_t row = row0; row < row1; row++) {
        const void *wrow = (const char *)w->data + row * w->row_bytes;
        for (int64_t t = t0; t < t1; t++)
            vec_dot(n_in, &matmul_out(job, t)[row], wrow, (const char *)job->xq + t * job->xq_row);
    }
}

/* Panels [p0, p1) of a job's weight for tokens [t0, t1), the outputs in a tile of the thread's
 * scatter scratch and from there into each token's row (job->out_rows): a tile of
 * FORWARD_SCATTER_PANELS panels is read from memory for its first FORWARD_SCATTER_TOKENS tokens
 * and stays in L2 for the next ones. The panel kernel's outputs depend on their row and token
 * only, so the bits are those of one call over all the panels and tokens. */
static void matmul_panels_scattered(struct model_runner *r, const matmul_job *job, int64_t p0,
                                    int64_t p1, int64_t t0, int64_t t1, uint32_t ith) {
    const model_weight *w = job->w;
    const size_t aux_stride = (size_t)(w->n_in / QK8_0);
    float *tile = r->scatter +
                  (size_t)ith * FORWARD_SCATTER_TOKENS * FORWARD_SCATTER_PANELS * KERNEL_PANEL_ROWS;
    for (int64_t p = p0; p < p1; p += FORWARD_SCATTER_PANELS) {
        const int64_t np = p1 - p < FORWARD_SCATTER_PANELS ? p1 - p : FORWARD_SCATTER_PANELS;
        const size_t cols = (size_t)np * KERNEL_PANEL_ROWS;
        for (int64_t t = t0; t < t1; t += FORWARD_SCATTER_TOKENS) {
            const int64_t nt = t1 - t < FORWARD_SCATTER_TOKENS ? t1 - t : FORWARD_SCATTER_TOKENS;
            r->ops->type[w->type].panel_dot(
                w->n_in, (const char *)w->data + p * KERNEL_PANEL_ROWS * w->row_bytes, np,
                (const char *)job->py + t * job->py_row, job->py_row,
                r->act_aux ? r->act_aux + t * aux_stride : NULL, aux_stride, nt, tile, cols);
            for (int64_t k = 0; k < nt; k++)
                memcpy(job->out_rows[t + k] + p * KERNEL_PANEL_ROWS, tile + (size_t)k * cols,
                       cols * sizeof(float));
        }
    }
}

/* Units [u0, u1) of a job for tokens [t0, t1): its full panels in one call of the panel kernel
 * (which keeps several panels' arithmetic in flight when the tokens are few), the other units
 * row by row. */
static void matmul_units(struct model_runner *r, const matmul_task *task, const matmul_job *job,
                         int64_t u0, int64_t u1, int64_t t0, int64_t t1, uint32_t ith) {
    const model_weight *w = job->w;
    if (w->panels) {
        const int64_t full = w->n_out / KERNEL_PANEL_ROWS;
        const int64_t p1 = u1 < full ? u1 : full;
        if (u0 < p1 && job->out_rows) {
            matmul_panels_scattered(r, job, u0, p1, t0, t1, ith);
            u0 = p1;
        } else if (u0 < p1) {
            const size_t aux_stride = (size_t)(w->n_in / QK8_0);
            r->ops->type[w->type].panel_dot(
                w->n_in, (const char *)w->data + u0 * KERNEL_PANEL_ROWS * w->row_bytes, p1 - u0,
                (const char *)job->py + t0 * job->py_row, job->py_row,
                r->act_aux ? r->act_aux + t0 * aux_stride : NULL, aux_stride, t1 - t0,
                job->out + t0 * w->n_out + u0 * KERNEL_PANEL_ROWS, (size_t)w->n_out);
            u0 = p1;
        }
    }
    for (int64_t u = u0; u < u1; u++) {
        const int64_t row0 = u * KERNEL_PANEL_ROWS;
        const int64_t row1 =
            row0 + KERNEL_PANEL_ROWS < w->n_out ? row0 + KERNEL_PANEL_ROWS : w->n_out;
        matmul_rows(r, task, job, row0, row1, t0, t1, ith);
    }
}

/* The quantization of a batch's activations as a pool run: a range of token rows per thread. */
typedef struct quantize_task {
    struct model_runner *r;
    const float *x;
    int64_t n_tok, n_in;
    tensor_type vt;
} quantize_task;

static void quantize_thread(void *arg, uint32_t ith, uint32_t nth) {
    const quantize_task *q = arg;
    act_quantize_rows(q->r, q->x, split_begin(q->n_tok, ith, nth),
                      split_begin(q->n_tok, ith + 1, nth), q->n_in, q->vt);
}

/* The next claim of a run: units [*u0, *u1) for tokens [*t0, *t1); false when none is left. One
 * chunk: the units left over the thread count, at least FORWARD_MATMUL_MIN_CLAIM_UNITS. Several:
 * (chunk, block of units) pairs in order, chunk by chunk. Either way a thread that streams its
 * weights faster, or starts sooner, takes more of them, so the threads of a run finish together
 * instead of the quicker one waiting at the end of every product. */
static bool matmul_claim(matmul_task *task, uint32_t nth, int64_t *u0, int64_t *u1, int64_t *t0,
                         int64_t *t1) {
    if (task->n_claims == 0) {
        int64_t next = atomic_load_explicit(&task->claim, memory_order_relaxed), take;
        do {
            if (next >= task->n_units) return false;
            const int64_t left = task->n_units - next;
            take = left / (int64_t)nth;
            if (take < FORWARD_MATMUL_MIN_CLAIM_UNITS) take = FORWARD_MATMUL_MIN_CLAIM_UNITS;
            if (take > left) take = left;
        } while (!atomic_compare_exchange_weak_explicit(
            &task->claim, &next, next + take, memory_order_relaxed, memory_order_relaxed));
        *u0 = next;
        *u1 = next + take;
        *t0 = 0;
        *t1 = task->n_tok;
        return true;
    }
    const int64_t k = atomic_fetch_add_explicit(&task->claim, 1, memory_order_relaxed);
    if (k >= task->n_claims) return false;
    *t0 = k / task->n_blocks * task->chunk;
    *t1 = *t0 + task->chunk < task->n_tok ? *t0 + task->chunk : task->n_tok;
    *u0 = k % task->n_blocks * task->block;
    *u1 = *u0 + task->block < task->n_units ? *u0 + task->block : task->n_units;
    return true;
}

/* Runs claims until none are left. */
static void matmul_thread(void *arg, uint32_t ith, uint32_t nth) {
    matmul_task *task = arg;
    int64_t u0, u1, t0, t1;
    while (matmul_claim(task, nth, &u0, &u1, &t0, &t1)) {
        /* The block, cut where one job's units end and the next one's begin. */
        int j = 0;
        for (int64_t u = u0; u < u1;) {
            while (u >= task->job[j].first_unit + task->job[j].n_units) j++;
            const matmul_job *job = &task->job[j];
            const int64_t end =
                job->first_unit + job->n_units < u1 ? job->first_unit + job->n_units : u1;
            matmul_units(task->r, task, job, u - job->first_unit, end - job->first_unit, t0, t1,
                         ith);
            u = end;
        }
    }
}

/* Make sure x is quantized to vt for this epoch (one job's activations). */
static void matmul_prepare(struct model_runner *r, matmul_task *task, matmul_job *job) {
    const model_weight *w = job->w;
    job->vt = w->traits->vec_dot_type;
    job->xq = job->vt == TENSOR_TYPE_F32 ? (const void *)task->x : r->act_q[job->vt];
    job->xq_row = tensor_row_size(job->vt, w->n_in);
    job->py = job->xq;
    job->py_row = job->xq_row;
    if (w->panels && w->type == TENSOR_TYPE_F16) {
        job->py = r->act_f16_f32;
        job->py_row = (size_t)w->n_in * sizeof(float);
    }
    if (job->vt == TENSOR_TYPE_F32 || act_is_quantized(r, task->x, task->n_tok, w->n_in, job->vt))
        return;
    if (task->n_tok >= FORWARD_PARALLEL_QUANTIZE_MIN_TOKENS) {
        quantize_task q = {
            .r = r, .x = task->x, .n_tok = task->n_tok, .n_in = w->n_in, .vt = job->vt};
        threadpool_run_slices(r->pool, quantize_thread, &q);
    } else {
        act_quantize_rows(r, task->x, 0, task->n_tok, w->n_in, job->vt);
    }
    r->act_cached[job->vt] =
        (act_cache_entry){.src = task->x, .epoch = r->epoch, .n_tok = task->n_tok, .n_in = w->n_in};
}

/* forward_matmul_group, and with out_rows set (n 1) forward_matmul_rows. */
static void matmul_run(struct model_runner *r, int n, float *const *out, float *const *out_rows,
                       const model_weight *const *w, const float *x, int64_t n_tok) {
    for (int i = 0; r->observer && i < n; i++)
        r->observer(r->observer_user, w[i]->file_data, x, n_tok, w[i]->n_in);
    matmul_task task = {.r = r, .x = x, .n_tok = n_tok};
    size_t widest = 1;
    bool heavy = false; /* a weight of more than one byte per element */
    for (int i = 0; i < n; i++) {
        matmul_job *job = &task.job[i];
        *job = (matmul_job){.w = w[i],
                            .out = out ? out[i] : NULL,
                            .out_rows = out_rows,
                            .first_unit = task.n_units};
        job->n_units = (w[i]->n_out + KERNEL_PANEL_ROWS - 1) / KERNEL_PANEL_ROWS;
        task.n_units += job->n_units;
        if (r->m->params.compute != MODEL_COMPUTE_REFERENCE) matmul_prepare(r, &task, job);
        if (job->xq_row > widest) widest = job->xq_row;
        if (job->py_row > widest) widest = job->py_row;
        if (w[i]->row_bytes > (size_t)w[i]->n_in) heavy = true;
    }
    /* Whole tiles of 16 tokens per chunk (the widest tile of kernels_panel.inc), at least one. */
    int64_t chunk = (int64_t)(FORWARD_TOKEN_CHUNK_BYTES / widest) / 16 * 16;
    if (heavy && chunk < FORWARD_HEAVY_WEIGHT_CHUNK_TOKENS)
        chunk = FORWARD_HEAVY_WEIGHT_CHUNK_TOKENS;
    task.chunk = chunk < 16 ? 16 : chunk;
    if (n_tok > task.chunk) { /* several chunks: (chunk, block) claims; else shrinking shares */
        const int64_t n_threads = threadpool_n_threads(r->pool);
        task.block = task.n_units / (n_threads * FORWARD_MATMUL_CLAIMS_PER_THREAD);
        if (task.block < 1) task.block = 1;
        task.n_blocks = (task.n_units + task.block - 1) / task.block;
        task.n_claims = task.n_blocks * ((n_tok + task.chunk - 1) / task.chunk);
    }
    atomic_init(&task.claim, 0);
    threadpool_run_slices(r->pool, matmul_thread, &task);
}

void forward_matmul_group(struct model_runner *r, int n, float *const *out,
                          const model_weight *const *w, const float *x, int64_t n_tok) {
    matmul_run(r, n, out, NULL, w, x, n_tok);
}

void forward_matmul(struct model_runner *r, float *out, const model_weight *w, const float *x,
                    int64_t n_tok) {
    matmul_run(r, 1, &out, NULL, &w, x, n_tok);
}

void forward_matmul_rows(struct model_runner *r, float *const *out_rows, const model_weight *w,
                         const float *x, int64_t n_tok) {
    matmul_run(r, 1, NULL, out_rows, &w, x, n_tok);
}

void model_runner_set_observer(model_runner *r, model_matmul_observer fn, void *user) {
    r->observer = fn;
    r->observer_user = fn ? user : NULL;
}

void forward_get_row(const struct model_runner *r, const model_weight *w, int64_t row, float *dst) {
    const void *src = (const char *)w->data + row * w->row_bytes;
    if (w->panels) {
        kernels_panel_get_row(w->type, w->data, w->n_in, w->n_out, row, r->row_q);
        src = r->row_q;
    }
    if (w->type == TENSOR_TYPE_F32)
        memcpy(dst, src, (size_t)w->n_in * sizeof(float));
    else
        r->ops->type[w->type].to_float(src, dst, w->n_in);
}

/* Store the K or V heads of one position (src: n_head_kv * head_dim floats), each into its own
 * head's rows. The path's F16 converter is byte-identical to tensor_f32_to_fp16
 * (test_kernels.c). */
static void kv_store(const struct model_runner *r, struct kv_cache *kv, void *base, uint32_t il,
                     uint32_t pos, const float *src) {
    for (uint32_t h = 0; h < kv->n_head_kv; h++) {
        void *dst = kv_cache_row(kv, base, il, h, pos);
        const float *head = src + (size_t)h * kv->head_dim;
        if (kv->type == KV_TYPE_F32)
            memcpy(dst, head, kv->head_dim * sizeof(float));
        else
            r->ops->type[TENSOR_TYPE_F16].from_float(head, dst, (int64_t)kv->head_dim);
    }
}

/* Attention of a batch as a pool run. The work is cut into (head set, token) units: a head set is
 * up to KERNEL_ATTN_MAX_HEADS consecutive query heads of one KV head (grouped-query attention),
 * which the kernel serves with one pass over the KV rows; a group is cut into smaller sets only
 * when the units would not share out evenly among the threads (decoding a model with few KV
 * heads). The units are ordered head set first and split into contiguous ranges: that keeps the
 * threads' shares even in a prefill, where later tokens attend to more positions, and in a batch
 * of sequences at different depths, since every thread gets all tokens of its head sets. A token
 * attends over its own sequence's cache, positions 0 to its own. Each head's output is computed
 * by the same operations whatever the sets and the split (kernels.h), so the results do not
 * depend on them. */
typedef struct attend_task {
    struct model_runner *r;
    const forward_batch *b;
    uint32_t il;
} attend_task;

static void attend_thread(void *arg, uint32_t ith, uint32_t nth) {
    const attend_task *task = arg;
    struct model_runner *r = task->r;
    const forward_batch *b = task->b;
    const uint32_t n_tok = b->n_tok;
    const model_hparams *hp = &r->m->hp;
    const uint32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    /* Whole groups (each KV head's rows read once) where the units share out evenly among the
     * threads or are many; else groups cut into more sets until they do, or every set is one
     * head. (SmolLM2 decoding on 2 threads: 3 groups of 3 heads give 1 and 2 units, 2 sets a
     * group 3 and 3.) */
    uint32_t sets_per_group = (group + KERNEL_ATTN_MAX_HEADS - 1) / KERNEL_ATTN_MAX_HEADS;
    for (;;) {
        const int64_t units = (int64_t)hp->n_head_kv * sets_per_group * n_tok;
        if (sets_per_group >= group || (units % nth == 0 || units >= 4 * (int64_t)nth)) break;
        sets_per_group++;
    }
    const uint32_t set_heads = (group + sets_per_group - 1) / sets_per_group;
    sets_per_group = (group + set_heads - 1) / set_heads;
    const int64_t n_q = (int64_t)hp->n_head * hd;
    const int64_t n_units = (int64_t)hp->n_head_kv * sets_per_group * n_tok;
    float *scores = r->scores + (size_t)ith * KERNEL_ATTN_MAX_HEADS * hp->n_ctx_train;
    /* A sliding layer's query at p sees positions p - n_swa + 1 .. p, a full layer's 0 .. p. */
    const uint32_t window = r->m->layer_swa[task->il] ? hp->n_swa : UINT32_MAX;
    const int64_t end = split_begin(n_units, ith + 1, nth);
    for (int64_t i = split_begin(n_units, ith, nth); i < end; i++) {
        const uint32_t set = (uint32_t)(i / n_tok), t = (uint32_t)(i % n_tok);
        const uint32_t kvh = set / sets_per_group;
        const uint32_t h0 = kvh * group + (set % sets_per_group) * set_heads;
        const uint32_t h1 = h0 + set_heads < (kvh + 1) * group ? h0 + set_heads : (kvh + 1) * group;
        const struct kv_cache *kv = b->kv[t];
        const uint32_t n_pos = b->pos[t] + 1 < window ? b->pos[t] + 1 : window;
        const uint32_t first = b->pos[t] + 1 - n_pos;
        r->ops->attn_heads(h1 - h0, r->q + t * n_q + (size_t)h0 * hd,
                           kv_cache_row(kv, kv->k, task->il, kvh, first),
                           kv_cache_row(kv, kv->v, task->il, kvh, first), hd, n_pos, hd,
                           hp->attn_scale, kv->type == KV_TYPE_F16, scores,
                           r->attn + t * n_q + (size_t)h0 * hd);
    }
}

static void add_bias(float *y, const model_weight *b, int64_t t0, int64_t t1) {
    if (!b->data) return;
    for (int64_t t = t0; t < t1; t++) ops_add(y + t * b->n_in, b->data, b->n_in);
}

/* Batches of at least this many tokens have their row operations (norms, rotations, SwiGLU) done
 * by all threads, as a pool run each; smaller ones by the calling thread. */
#define FORWARD_PARALLEL_ROWS_MIN_TOKENS 8

/* The operations between the matrix products, token by token: each token's row is independent,
 * so a split of the tokens among threads changes no result. */
typedef enum rows_op {
    /* add = rms_norm(add) * post (when post is set); x += add (when add is set);
     * xn = rms_norm(x) * norm (when norm is set) */
    ROWS_ADD_NORM,
    /* biases; each head of q and k RMS-normalised (when the layer has q/k norms); rotation of q
     * and k; k and v into each token's cache */
    ROWS_QKV,
    ROWS_GLU, /* gate = act(gate) * up, act the architecture's (SiLU or GELU-tanh) */
} rows_op;

typedef struct rows_task {
    struct model_runner *r;
    const forward_batch *b; /* ROWS_QKV: each token's cache and position */
    rows_op op;
    uint32_t n_tok, il;
    float *add;
    const model_weight *post;
    const model_weight *norm;
} rows_task;

/* RMS-normalise each of n_heads heads of x in place with one [head_dim] weight (no-op without
 * the weight). */
static void norm_heads(const struct model_runner *r, float *x, const model_weight *w,
                       uint32_t n_heads) {
    if (!w->data) return;
    const model_hparams *hp = &r->m->hp;
    for (uint32_t h = 0; h < n_heads; h++)
        r->ops->rms_norm(x + (size_t)h * hp->head_dim, x + (size_t)h * hp->head_dim, w->data,
                         hp->head_dim, hp->rms_eps);
}

static void rows_thread(void *arg, uint32_t ith, uint32_t nth) {
    const rows_task *task = arg;
    struct model_runner *r = task->r;
    const struct model *m = r->m;
    const model_hparams *hp = &m->hp;
    const int64_t n_embd = hp->n_embd, n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_kv = (int64_t)hp->n_head_kv * hp->head_dim, n_ff = hp->n_ff;
    const int64_t t0 = split_begin(task->n_tok, ith, nth),
                  t1 = split_begin(task->n_tok, ith + 1, nth);
    switch (task->op) {
        case ROWS_ADD_NORM:
            for (int64_t t = t0; t < t1; t++) {
                if (task->add && task->post && task->post->data)
                    r->ops->rms_norm(task->add + t * n_embd, task->add + t * n_embd,
                                     task->post->data, n_embd, hp->rms_eps);
                if (task->add) ops_add(r->x + t * n_embd, task->add + t * n_embd, n_embd);
                if (task->norm)
                    r->ops->rms_norm(r->xn + t * n_embd, r->x + t * n_embd, task->norm->data,
                                     n_embd, hp->rms_eps);
            }
            break;
        case ROWS_QKV: {
            const uint32_t il = task->il;
            add_bias(r->q, model_layer_weight(m, il, ARCH_ROLE_ATTN_Q_BIAS), t0, t1);
            add_bias(r->k, model_layer_weight(m, il, ARCH_ROLE_ATTN_K_BIAS), t0, t1);
            add_bias(r->v, model_layer_weight(m, il, ARCH_ROLE_ATTN_V_BIAS), t0, t1);
            const model_weight *q_norm = model_layer_weight(m, il, ARCH_ROLE_ATTN_Q_NORM);
            const model_weight *k_norm = model_layer_weight(m, il, ARCH_ROLE_ATTN_K_NORM);
            /* Sliding layers rotate with their own base (and never a scaled one). */
            const int slides = m->layer_swa[il];
            const rope_params *rope = slides ? &m->rope_swa : &m->rope;
            const float *rope_cs = slides ? r->rope_cs_swa : r->rope_cs;
            for (int64_t t = t0; t < t1; t++) {
                const float *cs = rope_cs + (size_t)t * hp->n_rot;
                norm_heads(r, r->q + t * n_q, q_norm, hp->n_head);
                norm_heads(r, r->k + t * n_kv, k_norm, hp->n_head_kv);
                r->ops->rope(rope, r->q + t * n_q, (int32_t)hp->n_head, (int32_t)hp->head_dim, cs);
                r->ops->rope(rope, r->k + t * n_kv, (int32_t)hp->n_head_kv, (int32_t)hp->head_dim,
                             cs);
                struct kv_cache *kv = task->b->kv[t];
                kv_store(r, kv, kv->k, il, task->b->pos[t], r->k + t * n_kv);
                kv_store(r, kv, kv->v, il, task->b->pos[t], r->v + t * n_kv);
            }
            break;
        }
        case ROWS_GLU: {
            /* Row by row: a kernel may treat the end of its range apart (the avx2 one takes its
             * last elements one by one, with libm's expf), so the range must not depend on the
             * split. */
            void (*glu)(float *, const float *, int64_t) =
                m->arch->ffn_act == ARCH_FFN_GELU_TANH ? r->ops->geglu : r->ops->swiglu;
            for (int64_t t = t0; t < t1; t++) glu(r->gate + t * n_ff, r->up + t * n_ff, n_ff);
            break;
        }
    }
}

static void forward_rows(const rows_task *task) {
    if (task->n_tok >= FORWARD_PARALLEL_ROWS_MIN_TOKENS)
        threadpool_run_slices(task->r->pool, rows_thread, (void *)task);
    else
        rows_thread((void *)task, 0, 1);
}

void forward_decoder(struct model_runner *r, const forward_batch *b) {
    const struct model *m = r->m;
    const model_hparams *hp = &m->hp;
    const int64_t n_embd = hp->n_embd;
    const uint32_t n_tok = b->n_tok;

    for (uint32_t t = 0; t < n_tok; t++) {
        float *x = r->x + t * n_embd;
        forward_get_row(r, &m->global[ARCH_ROLE_TOKEN_EMBD], b->tokens[t], x);
        if (hp->embd_scale != 1.0f)
            for (int64_t i = 0; i < n_embd; i++) x[i] *= hp->embd_scale;
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        ops_rope_cache(&m->rope, (int32_t)b->pos[t], r->rope_cs + (size_t)t * hp->n_rot);
        if (r->rope_cs_swa)
            ops_rope_cache(&m->rope_swa, (int32_t)b->pos[t],
                           r->rope_cs_swa + (size_t)t * hp->n_rot);
    }

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        /* Attention (the previous layer's feed-forward output joins the residual here, after
         * its post-norm when the architecture has one). */
        forward_rows(&(rows_task){
            .r = r,
            .op = ROWS_ADD_NORM,
            .n_tok = n_tok,
            .add = il > 0 ? r->tmp : NULL,
            .post = il > 0 ? model_layer_weight(m, il - 1, ARCH_ROLE_FFN_POST_NORM) : NULL,
            .norm = model_layer_weight(m, il, ARCH_ROLE_ATTN_NORM)});
        r->epoch++;
        {
            float *const outs[] = {r->q, r->k, r->v};
            const model_weight *const ws[] = {model_layer_weight(m, il, ARCH_ROLE_ATTN_Q),
                                              model_layer_weight(m, il, ARCH_ROLE_ATTN_K),
                                              model_layer_weight(m, il, ARCH_ROLE_ATTN_V)};
            forward_matmul_group(r, 3, outs, ws, r->xn, n_tok);
        }
        forward_rows(&(rows_task){.r = r, .b = b, .op = ROWS_QKV, .n_tok = n_tok, .il = il});
        attend_task at = {.r = r, .b = b, .il = il};
        threadpool_run_slices(r->pool, attend_thread, &at);
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_ATTN_OUT), r->attn, n_tok);

        /* Feed-forward. */
        forward_rows(&(rows_task){.r = r,
                                  .op = ROWS_ADD_NORM,
                                  .n_tok = n_tok,
                                  .add = r->tmp,
                                  .post = model_layer_weight(m, il, ARCH_ROLE_ATTN_POST_NORM),
                                  .norm = model_layer_weight(m, il, ARCH_ROLE_FFN_NORM)});
        r->epoch++;
        {
            float *const outs[] = {r->gate, r->up};
            const model_weight *const ws[] = {model_layer_weight(m, il, ARCH_ROLE_FFN_GATE),
                                              model_layer_weight(m, il, ARCH_ROLE_FFN_UP)};
            forward_matmul_group(r, 2, outs, ws, r->xn, n_tok);
        }
        forward_rows(&(rows_task){.r = r, .op = ROWS_GLU, .n_tok = n_tok});
        r->epoch++;
        forward_matmul(r, r->tmp, model_layer_weight(m, il, ARCH_ROLE_FFN_DOWN), r->gate, n_tok);
    }
    forward_rows(
        &(rows_task){.r = r,
                     .op = ROWS_ADD_NORM,
                     .n_tok = n_tok,
                     .add = r->tmp,
                     .post = model_layer_weight(m, hp->n_layer - 1, ARCH_ROLE_FFN_POST_NORM)});
    /* A sequence's tokens are in order: its last one leaves its cache's count. */
    for (uint32_t t = 0; t < n_tok; t++) b->kv[t]->n_pos = b->pos[t] + 1;
}
