/*
 * quantize_plan.c — which tensor gets which type: llama.cpp's quantization recipe
 * (llama_tensor_get_type and what feeds it, src/llama-quant.cpp), for the file types corral
 * writes. Contracts in quantize.h.
 *
 * The recipe is order-dependent: the mixtures count attn_v and ffn_down tensors as they are met
 * (i_attention_wv, i_ffn_down) and pick layers by that count, so the tensors are visited in
 * llama.cpp's order, its model loader's weights map: sorted by the layer number of "blk.N." (-1
 * for the others, which thus come first), then by name. The output is written in that order too.
 *
 * Names decide everything. A tensor's category comes from substrings of its name (the first
 * matching row of category_table), whether it may be quantized from its shape and a list of
 * names that must not be (no_quantize_table). Model facts come from the metadata:
 * <arch>.block_count (the layers counted for ffn_down), <arch>.expert_count (8-expert rules),
 * <arch>.attention.head_count(_kv) (the 70B-class rule).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "corral/log.h"
#include "quantize_impl.h"

/* ---- file types ------------------------------------------------------------------------------ */

typedef struct ftype_row {
    const char *name;
    quantize_ftype ftype;
    tensor_type type; /* the default tensor type */
} ftype_row;

/* Aliases after the canonical names, so that a file type's name is its first row. */
static const ftype_row ftype_table[] = {
    {"F32", QUANTIZE_FTYPE_F32, TENSOR_TYPE_F32},
    {"F16", QUANTIZE_FTYPE_F16, TENSOR_TYPE_F16},
    {"BF16", QUANTIZE_FTYPE_BF16, TENSOR_TYPE_BF16},
    {"Q4_0", QUANTIZE_FTYPE_Q4_0, TENSOR_TYPE_Q4_0},
    {"Q4_1", QUANTIZE_FTYPE_Q4_1, TENSOR_TYPE_Q4_1},
    {"Q5_0", QUANTIZE_FTYPE_Q5_0, TENSOR_TYPE_Q5_0},
    {"Q5_1", QUANTIZE_FTYPE_Q5_1, TENSOR_TYPE_Q5_1},
    {"Q8_0", QUANTIZE_FTYPE_Q8_0, TENSOR_TYPE_Q8_0},
    {"Q4_K_S", QUANTIZE_FTYPE_Q4_K_S, TENSOR_TYPE_Q4_K},
    {"Q4_K_M", QUANTIZE_FTYPE_Q4_K_M, TENSOR_TYPE_Q4_K},
    {"Q5_K_S", QUANTIZE_FTYPE_Q5_K_S, TENSOR_TYPE_Q5_K},
    {"Q5_K_M", QUANTIZE_FTYPE_Q5_K_M, TENSOR_TYPE_Q5_K},
    {"Q6_K", QUANTIZE_FTYPE_Q6_K, TENSOR_TYPE_Q6_K},
    {"Q4_K", QUANTIZE_FTYPE_Q4_K_M, TENSOR_TYPE_Q4_K}, /* llama-quantize's aliases */
    {"Q5_K", QUANTIZE_FTYPE_Q5_K_M, TENSOR_TYPE_Q5_K},
};
#define N_FTYPES (sizeof ftype_table / sizeof ftype_table[0])

static const ftype_row *ftype_find(quantize_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftype_table[i].ftype == f) return &ftype_table[i];
    return NULL;
}

int quantize_ftype_from_name(const char *name, quantize_ftype *out) {
    for (size_t i = 0; name && i < N_FTYPES; i++) {
        if (strcasecmp(ftype_table[i].name, name) == 0) {
            *out = ftype_table[i].ftype;
            return 0;
        }
    }
    return -1;
}

const char *quantize_ftype_name(quantize_ftype f) {
    const ftype_row *r = ftype_find(f);
    return r ? r->name : "?";
}

const char *quantize_ftype_names(void) {
    return "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_S, Q4_K_M (Q4_K), Q5_K_S, Q5_K_M (Q5_K), Q6_K, "
           "F16, BF16, F32";
}

tensor_type quantize_ftype_default_type(quantize_ftype f) {
    const ftype_row *r = ftype_find(f);
    return r ? r->type : TENSOR_TYPE_COUNT;
}

static const char *const reason_names[QUANTIZE_REASON_COUNT] = {
    [QUANTIZE_REASON_KEPT] = "kept",         [QUANTIZE_REASON_DEFAULT] = "default",
    [QUANTIZE_REASON_RECIPE] = "recipe",     [QUANTIZE_REASON_OVERRIDE] = "override",
    [QUANTIZE_REASON_FALLBACK] = "fallback", [QUANTIZE_REASON_BUDGET] = "budget",
};

const char *quantize_reason_name(quantize_reason r) {
    return (unsigned)r < QUANTIZE_REASON_COUNT ? reason_names[r] : "?";
}

int quantize__type_writable(uint32_t type) {
    return tensor_type_is_supported(type);
}

/* ---- names ----------------------------------------------------------------------------------- */

typedef enum category {
    CAT_OTHER,
    CAT_TOKEN_EMBD,
    CAT_OUTPUT,
    CAT_ATTN_Q,
    CAT_ATTN_K,
    CAT_ATTN_V,
    CAT_ATTN_QKV,
    CAT_ATTN_KV_B,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
} category;

/* llama.cpp's tensor_get_category: the first row whose text is the name (exact) or is found in
 * it decides. */
static const struct {
    const char *text;
    int exact;
    category cat;
} category_table[] = {
    {"output.weight", 1, CAT_OUTPUT},
    {"token_embd.weight", 1, CAT_TOKEN_EMBD},
    {"per_layer_token_embd.weight", 1, CAT_TOKEN_EMBD},
    {"attn_qkv.weight", 0, CAT_ATTN_QKV},
    {"attn_kv_b.weight", 0, CAT_ATTN_KV_B},
    {"attn_v.weight", 0, CAT_ATTN_V},
    {"attn_k.weight", 0, CAT_ATTN_K},
    {"attn_q.weight", 0, CAT_ATTN_Q},
    {"attn_output.weight", 0, CAT_ATTN_OUTPUT},
    {"ffn_up", 0, CAT_FFN_UP},
    {"ffn_gate", 0, CAT_FFN_GATE},
    {"ffn_down", 0, CAT_FFN_DOWN},
};

static category category_of(const char *name) {
    for (size_t i = 0; i < sizeof category_table / sizeof category_table[0]; i++) {
        const int hit = category_table[i].exact ? strcmp(name, category_table[i].text) == 0
                                                : strstr(name, category_table[i].text) != NULL;
        if (hit) return category_table[i].cat;
    }
    return CAT_OTHER;
}

/* The attention-value-like tensors llama.cpp treats alike (more sensitive to quantization). */
static int is_attn_v(category c) {
    return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B;
}

/* Names llama.cpp never quantizes (tensor_allows_quantization): found anywhere in the name, or
 * equal to it. */
static const struct {
    const char *text;
    int exact;
} no_quantize_table[] = {
    {"_norm.weight", 0},
    {"ffn_gate_inp.weight", 0}, /* expert gating */
    {"ffn_gate_tid2eid.weight", 0},
    {"altup", 0}, /* tiny (4x4) */
    {"laurel", 0},
    {"per_layer_model_proj", 0},
    {"position_embd.weight", 1}, /* positional embeddings and token types (BERT) */
    {"token_types.weight", 1},
    {"ssm_conv1d", 0}, /* small conv1d weights */
    {"shortconv.conv.weight", 0},
    {"indexer.k_proj.weight", 0},
    {"indexer.q_proj.weight", 0},
    {"time_mix_first.weight", 0}, /* RWKV's small 2-D weights */
    {"time_mix_w0.weight", 0},
    {"time_mix_w1.weight", 0},
    {"time_mix_w2.weight", 0},
    {"time_mix_v0.weight", 0},
    {"time_mix_v1.weight", 0},
    {"time_mix_v2.weight", 0},
    {"time_mix_a0.weight", 0},
    {"time_mix_a1.weight", 0},
    {"time_mix_a2.weight", 0},
    {"time_mix_g1.weight", 0},
    {"time_mix_g2.weight", 0},
    {"time_mix_decay_w1.weight", 0},
    {"time_mix_decay_w2.weight", 0},
    {"time_mix_lerp_fused.weight", 0},
    {"attn_rel_b.weight", 0}, /* relative position bias (T5) */
    {".position_embd", 0},    /* multimodal tensors */
    {"sam.pos_embd", 0},
    {"sam.neck.", 0},
    {"sam.net_", 0},
    {".rel_pos", 0},
    {".patch_embd", 0},
    {".patch_merger", 0},
    {"a.rvq.codebook", 0}, /* audio codebooks */
    {"mm.a.code_embd", 0},
};

/* ggml_n_dims: dimensions up to the last one above 1 (at least 1). */
static uint32_t effective_dims(const gguf_tensor *t) {
    uint32_t n = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

static int allows_quantization(const quantize_params *p, const gguf_tensor *t, const char *name) {
    if (effective_dims(t) < 2) return 0;
    const size_t len = strlen(name);
    if (len < 6 || strcmp(name + len - 6, "weight") != 0) return 0;
    if (p->leave_output && strcmp(name, "output.weight") == 0) return 0;
    for (size_t i = 0; i < sizeof no_quantize_table / sizeof no_quantize_table[0]; i++) {
        const int hit = no_quantize_table[i].exact
                            ? strcmp(name, no_quantize_table[i].text) == 0
                            : strstr(name, no_quantize_table[i].text) != NULL;
        if (hit) return 0;
    }
    return 1;
}

/* The layer of "blk.N.…" as sscanf("blk.%d.") reads it, or -1. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    if (end == name + 4 || v < INT32_MIN || v > INT32_MAX) return -1;
    return (int)v;
}

static int by_layer_then_name(const void *a, const void *b) {
    const quant_tensor *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ---- the recipe ------------------------------------------------------------------------------ */

/* What the recipe reads about the model, and its counters (llama.cpp's quantize_state_impl). */
typedef struct recipe_state {
    char arch[64];
    uint32_t n_layer, n_expert;
    int is_70b; /* llama.cpp's LLM_TYPE_70B */
    int has_imatrix;
    int tied; /* no output.weight: token_embd is the output */
    int n_attention_wv, i_attention_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
} recipe_state;

/* The models llama.cpp calls 70B-class by architecture and layer count (the llama rule also needs
 * grouped-query attention: with n_head == n_head_kv it is the 65B). */
static const struct {
    const char *arch;
    uint32_t n_layer;
    int needs_gqa;
} class_70b_table[] = {
    {"llama", 80, 1}, {"qwen2", 80, 0}, {"olmo", 80, 0}, {"deci", 80, 0}, {"jais2", 68, 0},
};

static uint32_t arch_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t def) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    return gguf_get_u32(f, key, &v, NULL) == CORRAL_OK ? v : def;
}

static void recipe_init(recipe_state *s, const gguf_file *in, const quant_tensor *ts, uint32_t n,
                        int has_imatrix) {
    memset(s, 0, sizeof *s);
    gguf_str a;
    if (gguf_get_str(in, "general.architecture", &a, NULL) == CORRAL_OK && a.len < sizeof s->arch) {
        memcpy(s->arch, a.data, (size_t)a.len);
        s->arch[a.len] = '\0';
    }
    s->n_layer = arch_u32(in, s->arch, "block_count", 0);
    s->n_expert = arch_u32(in, s->arch, "expert_count", 0);
    const uint32_t n_head = arch_u32(in, s->arch, "attention.head_count", 0);
    const uint32_t n_head_kv = arch_u32(in, s->arch, "attention.head_count_kv", n_head);
    for (size_t i = 0; i < sizeof class_70b_table / sizeof class_70b_table[0]; i++) {
        if (strcmp(s->arch, class_70b_table[i].arch) == 0 &&
            s->n_layer == class_70b_table[i].n_layer &&
            (!class_70b_table[i].needs_gqa || (n_head != n_head_kv && s->n_expert != 8)))
            s->is_70b = 1;
    }
    s->has_imatrix = has_imatrix;
    s->tied = 1;
    for (uint32_t i = 0; i < n; i++) {
        const category c = category_of(ts[i].name);
        if (is_attn_v(c)) s->n_attention_wv++;
        if (c == CAT_OUTPUT) s->tied = 0;
    }
}

static int use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

/* The layer a per-layer tensor's rule looks at: the running count, or for a model with experts
 * (whose tensors need not come in layer order) the number in the name. */
static corral_status layer_info(const recipe_state *s, int counter, const char *name, int *i_layer,
                                corral_error *err) {
    *i_layer = counter;
    if (s->n_expert > 1) {
        const int l = layer_of(name);
        if (l < 0 || (uint32_t)l >= s->n_layer)
            return corral_error_set(err, CORRAL_FORMAT,
                                    "tensor %s: cannot tell its layer (the model has %u)", name,
                                    s->n_layer);
        *i_layer = l;
    }
    return CORRAL_OK;
}

/* llama_tensor_get_type_impl for corral's file types (and llama.cpp's falcon, 70B and 8-expert
 * rules for them). *type comes in as the default type and leaves as the recipe's. */
static corral_status recipe_type(recipe_state *s, const quantize_params *p, const quant_tensor *t,
                                 uint32_t *type, corral_error *err) {
    const quantize_ftype ft = p->ftype;
    const category cat = category_of(t->name);
    const int falcon = strcmp(s->arch, "falcon") == 0;
    const int n_layer = (int)s->n_layer;
    if (cat == CAT_OUTPUT || (s->tied && cat == CAT_TOKEN_EMBD)) {
        if (p->output_tensor_type >= 0) {
            *type = (uint32_t)p->output_tensor_type;
        } else {
            const tensor_type_traits *tt = tensor_type_get_traits(*type);
            if (falcon || t->t->ne[0] % tt->block_size != 0)
                *type = TENSOR_TYPE_Q8_0;
            else if (*type != TENSOR_TYPE_Q8_0)
                *type = TENSOR_TYPE_Q6_K;
        }
    } else if (cat == CAT_TOKEN_EMBD) {
        if (p->token_embedding_type >= 0) *type = (uint32_t)p->token_embedding_type;
    } else if (is_attn_v(cat)) {
        if ((ft == QUANTIZE_FTYPE_Q4_K_M || ft == QUANTIZE_FTYPE_Q5_K_M) &&
            use_more_bits(s->i_attention_wv, s->n_attention_wv))
            *type = TENSOR_TYPE_Q6_K;
        else if (ft == QUANTIZE_FTYPE_Q4_K_S && s->i_attention_wv < 4)
            *type = TENSOR_TYPE_Q5_K;
        if (s->is_70b && *type == TENSOR_TYPE_Q4_K) *type = TENSOR_TYPE_Q5_K;
        if (s->n_expert == 8) *type = TENSOR_TYPE_Q8_0;
        s->i_attention_wv++;
    } else if (cat == CAT_ATTN_K) {
        if (s->n_expert == 8) *type = TENSOR_TYPE_Q8_0;
    } else if (cat == CAT_FFN_DOWN) {
        int il;
        corral_status st = layer_info(s, s->i_ffn_down, t->name, &il, err);
        if (st != CORRAL_OK) return st;
        if (ft == QUANTIZE_FTYPE_Q4_K_M) {
            if (falcon)
                *type = il < n_layer / 16            ? TENSOR_TYPE_Q6_K
                        : use_more_bits(il, n_layer) ? TENSOR_TYPE_Q5_K
                                                     : TENSOR_TYPE_Q4_K;
            else if (use_more_bits(il, n_layer))
                *type = TENSOR_TYPE_Q6_K;
        } else if (ft == QUANTIZE_FTYPE_Q5_K_M && use_more_bits(il, n_layer)) {
            *type = TENSOR_TYPE_Q6_K;
        } else if (ft == QUANTIZE_FTYPE_Q4_K_S && !falcon && il < n_layer / 8) {
            *type = TENSOR_TYPE_Q5_K;
        } else if ((ft == QUANTIZE_FTYPE_Q4_0 || ft == QUANTIZE_FTYPE_Q5_0) && s->has_imatrix &&
                   il < n_layer / 8) {
            /* llama.cpp guards the first ffn_down layers with an imatrix only, so that the same
             * file comes out without one as before. */
            *type = ft == QUANTIZE_FTYPE_Q4_0 ? TENSOR_TYPE_Q4_1 : TENSOR_TYPE_Q5_1;
        }
        s->i_ffn_down++;
    } else if (cat == CAT_ATTN_OUTPUT) {
        if (!falcon && s->n_expert == 8 &&
            (ft == QUANTIZE_FTYPE_Q4_K_S || ft == QUANTIZE_FTYPE_Q4_K_M))
            *type = TENSOR_TYPE_Q5_K;
    } else if (cat == CAT_FFN_GATE || cat == CAT_FFN_UP) {
        int il;
        corral_status st =
            layer_info(s, cat == CAT_FFN_GATE ? s->i_ffn_gate : s->i_ffn_up, t->name, &il, err);
        if (st != CORRAL_OK) return st;
        if (cat == CAT_FFN_GATE)
            s->i_ffn_gate++;
        else
            s->i_ffn_up++;
    }
    return CORRAL_OK;
}

/* How much a tensor's output noise reaches the logits, relative to a branch tensor of a layer
 * (quantize.h explains the budget's error): the output projection adds its noise to the logits
 * directly, while each of the 2 * n_layer branches and the embedding adds a share of the residual
 * stream; Q and K reach the output only through the softmax of the scores, which damps it. */
static double sensitivity_of(const recipe_state *s, category cat) {
    if (cat == CAT_OUTPUT || (s->tied && cat == CAT_TOKEN_EMBD)) return 2.0 * s->n_layer + 1.0;
    if (cat == CAT_ATTN_Q || cat == CAT_ATTN_K) return 0.25;
    return 1.0;
}

/* tensor_type_fallback: a type whose blocks the rows do not fit falls back. 0 when it fits. */
static const struct {
    tensor_type from, to;
} fallback_table[] = {
    {TENSOR_TYPE_Q4_K, TENSOR_TYPE_Q5_0},
    {TENSOR_TYPE_Q5_K, TENSOR_TYPE_Q5_1},
    {TENSOR_TYPE_Q6_K, TENSOR_TYPE_Q8_0},
};

static int fallback(const quant_tensor *t, uint32_t *type) {
    const int64_t ncols = t->t->ne[0];
    if (ncols % tensor_type_get_traits(*type)->block_size == 0) return 0;
    uint32_t to = TENSOR_TYPE_COUNT;
    for (size_t i = 0; i < sizeof fallback_table / sizeof fallback_table[0]; i++)
        if (fallback_table[i].from == *type) to = fallback_table[i].to;
    if (to == TENSOR_TYPE_COUNT) {
        /* llama.cpp has no fallback here and gives up on the whole file; corral keeps the tensor
         * in F16, llama.cpp's own last resort for rows that fit nothing. */
        log_warn("tensor rows fit no block of its type (llama-quantize would stop here): kept in "
                 "F16",
                 LOG_STR("tensor", t->name), LOG_INT("columns", ncols),
                 LOG_STR("type", tensor_type_name(*type)));
        *type = TENSOR_TYPE_F16;
        return 1;
    }
    if (ncols % tensor_type_get_traits(to)->block_size != 0) to = TENSOR_TYPE_F16;
    log_info("tensor rows do not fit the type's blocks: falling back", LOG_STR("tensor", t->name),
             LOG_INT("columns", ncols), LOG_STR("type", tensor_type_name(*type)),
             LOG_STR("fallback", tensor_type_name(to)));
    *type = to;
    return 1;
}

/* llama_tensor_get_type: overrides, then the recipe, then the fallback. */
static corral_status tensor_type_for(recipe_state *s, const quantize_params *p, quant_tensor *t,
                                     tensor_type default_type, int *fell_back, corral_error *err) {
    const category cat = category_of(t->name);
    if (p->token_embedding_type >= 0 && cat == CAT_TOKEN_EMBD) {
        t->type = (uint32_t)p->token_embedding_type;
        t->reason = QUANTIZE_REASON_OVERRIDE;
        return CORRAL_OK;
    }
    if (p->output_tensor_type >= 0 && cat == CAT_OUTPUT) {
        t->type = (uint32_t)p->output_tensor_type;
        t->reason = QUANTIZE_REASON_OVERRIDE;
        return CORRAL_OK;
    }
    uint32_t type = default_type;
    t->reason = QUANTIZE_REASON_DEFAULT;
    if (!tensor_type_get_traits(default_type)->is_quantized) {
        t->type = type;
        return CORRAL_OK;
    }
    int manual = 0;
    for (uint32_t r = 0; r < p->n_overrides; r++) {
        if (p->match(p->match_user, r, t->name)) {
            type = p->overrides[r].type;
            t->reason = QUANTIZE_REASON_OVERRIDE;
            manual = 1;
            break;
        }
    }
    if (!manual && !p->pure) {
        corral_status st = recipe_type(s, p, t, &type, err);
        if (st != CORRAL_OK) return st;
        if (type != default_type) t->reason = QUANTIZE_REASON_RECIPE;
    }
    *fell_back = fallback(t, &type);
    if (*fell_back) t->reason = QUANTIZE_REASON_FALLBACK;
    t->type = type;
    t->eligible = !manual;
    return CORRAL_OK;
}

/* ---- the plan -------------------------------------------------------------------------------- */

static corral_status check_params(const quantize_params *p, corral_error *err) {
    if (quantize_ftype_default_type(p->ftype) == TENSOR_TYPE_COUNT)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "unknown file type %d", p->ftype);
    if (p->n_overrides > 0 && (!p->overrides || !p->match))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor type overrides need a matcher");
    const struct {
        int type;
        const char *what;
    } types[] = {{p->output_tensor_type, "output tensor type"},
                 {p->token_embedding_type, "token embedding type"}};
    for (size_t i = 0; i < 2; i++) {
        if (types[i].type >= 0 && !quantize__type_writable((uint32_t)types[i].type))
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s %s: not a type corral runs",
                                    types[i].what, tensor_type_name((uint32_t)types[i].type));
    }
    for (uint32_t r = 0; r < p->n_overrides; r++) {
        if (!quantize__type_writable(p->overrides[r].type))
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "--tensor-type %s=%s: not a type corral runs",
                                    p->overrides[r].pattern ? p->overrides[r].pattern : "?",
                                    tensor_type_name(p->overrides[r].type));
    }
    if (!(p->target_bpw >= 0) || p->target_bpw > 64)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "target bits per weight %g: not in (0, 64]", p->target_bpw);
    if (p->calibration_text && !(p->target_bpw > 0))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "calibration text is for a size budget (target bits per weight)");
    if (p->calibration_text && p->source)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "calibration text needs the input file as the model; these "
                                "tensors come from elsewhere (a merge)");
    return CORRAL_OK;
}

/* What a converted tensor needs: a source of f32 rows, a type corral writes, an importance entry
 * of the right size. */
static corral_status check_conversion(const quantize_params *p, quant_tensor *t,
                                      corral_error *err) {
    if (!quantize__type_writable(t->type))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor %s: type %s is not one corral runs", t->name,
                                tensor_type_name(t->type));
    /* The two type options bypass the fallback (as in llama.cpp, which then aborts). */
    const int64_t block = tensor_type_get_traits(t->type)->block_size;
    if (t->t->ne[0] % block != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tensor %s: rows of %" PRId64 " do not fit %s's blocks of %" PRId64,
                                t->name, t->t->ne[0], tensor_type_name(t->type), block);
    if (!t->from_source) {
        const tensor_type_traits *st = tensor_type_get_traits(t->t->type);
        if (t->t->type != TENSOR_TYPE_F32 && (!st || !st->to_float))
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "tensor %s: cannot convert from type %s", t->name,
                                    tensor_type_name(t->t->type));
        if (st && st->is_quantized && !p->allow_requantize)
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "tensor %s: requantizing from type %s is disabled (quantize "
                                    "from F32, F16 or BF16, or allow requantizing)",
                                    t->name, tensor_type_name(t->t->type));
    }
    if (!p->imatrix || !tensor_type_get_traits(t->type)->is_quantized) return CORRAL_OK;
    uint64_t n;
    const float *imp = imatrix_find(p->imatrix, t->name, &n);
    if (!imp) return CORRAL_OK; /* quantized as without a matrix, as llama.cpp does */
    const int64_t ne2 = t->t->n_dims > 2 ? t->t->ne[2] : 1;
    if (n != (uint64_t)(t->t->ne[0] * ne2)) {
        if (category_of(t->name) == CAT_TOKEN_EMBD) return CORRAL_OK;
        return corral_error_set(err, CORRAL_FORMAT,
                                "importance matrix entry %s has %" PRIu64
                                " values, the tensor %" PRId64 " columns",
                                t->name, n, t->t->ne[0] * ne2);
    }
    t->importance = imp;
    t->importance_stride = t->t->ne[0];
    return CORRAL_OK;
}

corral_status quantize__plan_types(const gguf_file *in, const quantize_params *p,
                                   quant_tensor **out, uint32_t *n_fallback, corral_error *err) {
    *out = NULL;
    *n_fallback = 0;
    corral_status st = check_params(p, err);
    if (st != CORRAL_OK) return st;
    const uint64_t n = gguf_tensor_count(in);
    if (n > UINT32_MAX)
        return corral_error_set(err, CORRAL_UNSUPPORTED, "%s: too many tensors", gguf_path(in));
    quant_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    if (!ts) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(in, i);
        if (t->name.len >= QUANTIZE_NAME_MAX) {
            free(ts);
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: tensor name of %" PRIu64 " bytes is too long",
                                    gguf_path(in), t->name.len);
        }
        ts[i].t = t;
        ts[i].index = i;
        memcpy(ts[i].name, t->name.data, (size_t)t->name.len);
        ts[i].name[t->name.len] = '\0';
        ts[i].layer = layer_of(ts[i].name);
        ts[i].n_elements = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) ts[i].n_elements *= (uint64_t)t->ne[d];
        ts[i].n_rows = t->ne[0] ? (int64_t)(ts[i].n_elements / (uint64_t)t->ne[0]) : 0;
        ts[i].from_source = p->source && p->source->from_source && p->source->from_source[i];
    }
    qsort(ts, n, sizeof *ts, by_layer_then_name);

    recipe_state s;
    recipe_init(&s, in, ts, (uint32_t)n, p->imatrix != NULL);
    const tensor_type default_type = quantize_ftype_default_type(p->ftype);
    for (uint64_t i = 0; i < n && st == CORRAL_OK; i++) {
        quant_tensor *t = &ts[i];
        t->sensitivity = sensitivity_of(&s, category_of(t->name));
        if (!allows_quantization(p, t->t, t->name)) {
            t->type = t->t->type;
            t->reason = QUANTIZE_REASON_KEPT;
        } else {
            int fell_back = 0;
            st = tensor_type_for(&s, p, t, default_type, &fell_back, err);
            *n_fallback += (uint32_t)fell_back;
        }
        t->convert = t->type != t->t->type || t->from_source;
        if (st == CORRAL_OK && t->convert) st = check_conversion(p, t, err);
    }
    if (st != CORRAL_OK) {
        free(ts);
        return st;
    }
    *out = ts;
    return CORRAL_OK;
}
