/*
 * model.c — loading a model (hyperparameters, tokenizer, weight binding against the architecture
 * table), KV caches, runners, and the forward pass's driver: model_forward_batch's checks, its
 * cutting of the sequences' tokens into passes of the runner's max_batch, and the output
 * projection (model_forward is its one-sequence case).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/fault.h"
#include "corral/log.h"
#include "model_impl.h"
#include "tensor_blocks.h"

model_params model_params_default(void) {
    return (model_params){.compute = MODEL_COMPUTE_FAST};
}

/* ---- hyperparameters ------------------------------------------------------------------------- */

/* Read "<arch>.<suffix>" as u32 into *out. Missing keys keep *out when `required` is 0. */
static corral_status hp_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out,
                            int required, corral_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    corral_status st = gguf_get_u32(f, key, out, err);
    if (st == CORRAL_NOT_FOUND && !required) return CORRAL_OK;
    if (st == CORRAL_NOT_FOUND)
        return corral_error_set(err, CORRAL_FORMAT, "required metadata key %s is missing", key);
    return st;
}

static corral_status hp_f32(const gguf_file *f, const char *arch, const char *suffix, float *out,
                            int required, corral_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    corral_status st = gguf_get_f32(f, key, out, err);
    if (st == CORRAL_NOT_FOUND && !required) return CORRAL_OK;
    if (st == CORRAL_NOT_FOUND)
        return corral_error_set(err, CORRAL_FORMAT, "required metadata key %s is missing", key);
    return st;
}

/* Sliding-window attention, for the architectures that have it (arch_desc.swa): the window, the
 * layers that slide, and their rotation. Gemma 3 27B (62 layers) scales scores by
 * 1/sqrt(n_embd/n_head) rather than by the head size, as llama.cpp does. */
static corral_status model_read_swa(struct model *m, corral_error *err) {
    const gguf_file *f = m->file;
    model_hparams *hp = &m->hp;
    const char *a = hp->arch;
    corral_status st;
    m->layer_swa = calloc(hp->n_layer, 1);
    m->swa_before = calloc(hp->n_layer, sizeof *m->swa_before);
    if (!m->layer_swa || !m->swa_before)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    m->rope_swa = m->rope;
    if (!m->arch->swa) return CORRAL_OK;
    if (strcmp(a, "gemma3") == 0 && hp->n_layer == 62)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    if ((st = hp_u32(f, a, "attention.sliding_window", &hp->n_swa, 0, err))) return st;
    if (hp->n_swa == 0) return CORRAL_OK;
    hp->swa_pattern = m->arch->swa_pattern_default;
    hp->rope_freq_base_swa = m->arch->rope_base_swa_default;
    if ((st = hp_u32(f, a, "attention.sliding_window_pattern", &hp->swa_pattern, 0, err)) ||
        (st = hp_f32(f, a, "rope.freq_base_swa", &hp->rope_freq_base_swa, 0, err)))
        return st;
    if (hp->n_swa > (1u << 24) || hp->swa_pattern > hp->n_layer + 1)
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s.attention.sliding_window = %u / sliding_window_pattern = %u "
                                "out of range",
                                a, hp->n_swa, hp->swa_pattern);
    if (!(hp->rope_freq_base_swa > 1.0f) || !isfinite(hp->rope_freq_base_swa))
        return corral_error_set(err, CORRAL_FORMAT, "%s.rope.freq_base_swa = %g is out of range", a,
                                (double)hp->rope_freq_base_swa);
    /* llama.cpp's rule: pattern 0 makes every layer slide, pattern p the first p - 1 of every
     * p (so 1 makes none slide). */
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        m->layer_swa[il] =
            hp->swa_pattern == 0 || il % hp->swa_pattern < hp->swa_pattern - 1 ? 1 : 0;
        m->swa_before[il] = hp->n_swa_layers;
        hp->n_swa_layers += m->layer_swa[il];
    }
    m->rope_swa.freq_base = hp->rope_freq_base_swa;
    m->rope_swa.freq_scale = 1.0f;
    m->rope_swa.ext_factor = 0.0f;
    return CORRAL_OK;
}

static corral_status model_read_hparams(struct model *m, corral_error *err) {
    const gguf_file *f = m->file;
    model_hparams *hp = &m->hp;
    const char *a = hp->arch;
    corral_status st;
    if ((st = hp_u32(f, a, "context_length", &hp->n_ctx_train, 1, err)) ||
        (st = hp_u32(f, a, "embedding_length", &hp->n_embd, 1, err)) ||
        (st = hp_u32(f, a, "block_count", &hp->n_layer, 1, err)) ||
        (st = hp_u32(f, a, "feed_forward_length", &hp->n_ff, 1, err)) ||
        (st = hp_u32(f, a, "attention.head_count", &hp->n_head, 1, err)))
        return st;
    hp->n_head_kv = hp->n_head;
    if ((st = hp_u32(f, a, "attention.head_count_kv", &hp->n_head_kv, 0, err))) return st;
    if (hp->n_head == 0 || hp->n_head > 4096)
        return corral_error_set(err, CORRAL_FORMAT, "%s.attention.head_count = %u is out of range",
                                a, hp->n_head);
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s.attention.head_count_kv = %u must divide head_count = %u", a,
                                hp->n_head_kv, hp->n_head);
    if (hp->n_embd == 0 || hp->n_embd > (1u << 20) || hp->n_layer == 0 || hp->n_layer > 4096 ||
        hp->n_ff == 0 || hp->n_ff > (1u << 22) || hp->n_ctx_train == 0)
        return corral_error_set(err, CORRAL_FORMAT,
                                "hyperparameters out of range: embedding_length=%u "
                                "block_count=%u feed_forward_length=%u context_length=%u",
                                hp->n_embd, hp->n_layer, hp->n_ff, hp->n_ctx_train);
    /* The head size is n_embd / n_head unless the file says otherwise: Qwen3 and Gemma 3 have
     * heads wider than that (n_head * head_dim > n_embd), and the projections' shapes follow. */
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((st = hp_u32(f, a, "attention.key_length", &hp->head_dim, 0, err))) return st;
    uint32_t value_length = hp->head_dim;
    if ((st = hp_u32(f, a, "attention.value_length", &value_length, 0, err))) return st;
    if (hp->head_dim == 0 || hp->head_dim > 1024 || hp->head_dim % 2 != 0)
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s.attention.key_length = %u must be even and in 2..1024", a,
                                hp->head_dim);
    if (value_length != hp->head_dim)
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "%s.attention.value_length = %u differs from key_length = %u: "
                                "corral supports equal key and value head sizes",
                                a, value_length, hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((st = hp_u32(f, a, "rope.dimension_count", &hp->n_rot, 0, err))) return st;
    if (hp->n_rot == 0 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s.rope.dimension_count = %u must be even and at most the head "
                                "dimension %u",
                                a, hp->n_rot, hp->head_dim);
    hp->rms_eps = 1e-5f;
    if ((st = hp_f32(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 1, err))) return st;
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s.attention.layer_norm_rms_epsilon = %g is out of range", a,
                                (double)hp->rms_eps);
    hp->rope_freq_base = 10000.0f;
    if ((st = hp_f32(f, a, "rope.freq_base", &hp->rope_freq_base, 0, err))) return st;
    if (!(hp->rope_freq_base > 1.0f) || !isfinite(hp->rope_freq_base))
        return corral_error_set(err, CORRAL_FORMAT, "%s.rope.freq_base = %g is out of range", a,
                                (double)hp->rope_freq_base);

    /* RoPE scaling: none, linear (angles divided by the factor) or yarn. */
    snprintf(hp->rope_scaling, sizeof hp->rope_scaling, "none");
    float factor = 0.0f;
    if ((st = hp_f32(f, a, "rope.scaling.factor", &factor, 0, err))) return st;
    if ((st = hp_f32(f, a, "rope.scale_linear", &factor, 0, err))) return st;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    gguf_str type = {0};
    st = gguf_get_str(f, key, &type, err);
    if (st == CORRAL_OK) {
        snprintf(hp->rope_scaling, sizeof hp->rope_scaling, "%.*s",
                 (int)(type.len < 15 ? type.len : 15), type.data);
    } else if (st != CORRAL_NOT_FOUND) {
        return st;
    } else if (factor > 0.0f && factor != 1.0f) {
        snprintf(hp->rope_scaling, sizeof hp->rope_scaling, "linear");
    }
    hp->rope_freq_scale = 1.0f;
    m->rope = (rope_params){.style = m->arch->rope,
                            .n_rot = (int32_t)hp->n_rot,
                            .freq_base = hp->rope_freq_base,
                            .freq_scale = 1.0f,
                            .attn_factor = 1.0f,
                            .beta_fast = 32.0f,
                            .beta_slow = 1.0f,
                            .n_ctx_orig = (int32_t)hp->n_ctx_train};
    if (strcmp(hp->rope_scaling, "none") == 0) {
        /* nothing */
    } else if (strcmp(hp->rope_scaling, "linear") == 0 || strcmp(hp->rope_scaling, "yarn") == 0) {
        if (!(factor >= 1.0f && factor <= 1024.0f))
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s.rope.scaling.factor = %g is out of range for %s scaling", a,
                                    (double)factor, hp->rope_scaling);
        hp->rope_freq_scale = 1.0f / factor;
        m->rope.freq_scale = hp->rope_freq_scale;
        if (strcmp(hp->rope_scaling, "yarn") == 0) {
            uint32_t orig = hp->n_ctx_train;
            if ((st = hp_u32(f, a, "rope.scaling.original_context_length", &orig, 0, err)))
                return st;
            m->rope.n_ctx_orig = (int32_t)orig;
            m->rope.ext_factor = 1.0f;
        }
    } else {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "%s.rope.scaling.type '%s' is not supported (none, linear, yarn)",
                                a, hp->rope_scaling);
    }
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = m->arch->embd_scale_sqrt ? sqrtf((float)hp->n_embd) : 1.0f;
    if (m->arch->softcap) {
        if ((st = hp_f32(f, a, "final_logit_softcapping", &hp->logit_softcap, 0, err))) return st;
        if (!(hp->logit_softcap >= 0.0f && hp->logit_softcap < 1e6f))
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s.final_logit_softcapping = %g is out of range", a,
                                    (double)hp->logit_softcap);
    }
    return model_read_swa(m, err);
}

/* ---- weight binding -------------------------------------------------------------------------- */

static int64_t dim_value(const model_hparams *hp, arch_dim d) {
    switch (d) {
        case ARCH_DIM_NONE:
            return 1;
        case ARCH_DIM_EMBD:
            return hp->n_embd;
        case ARCH_DIM_VOCAB:
            return hp->n_vocab;
        case ARCH_DIM_Q:
            return (int64_t)hp->n_head * hp->head_dim;
        case ARCH_DIM_KV:
            return (int64_t)hp->n_head_kv * hp->head_dim;
        case ARCH_DIM_FF:
            return hp->n_ff;
        case ARCH_DIM_ROT_HALF:
            return hp->n_rot / 2;
        case ARCH_DIM_HEAD:
            return hp->head_dim;
        case ARCH_DIM_QKV:
            return ((int64_t)hp->n_head + 2 * (int64_t)hp->n_head_kv) * hp->head_dim;
        case ARCH_DIM_FF2:
            return 2 * (int64_t)hp->n_ff;
    }
    return -1;
}

/* Find, check and bind one tensor of the architecture into *w. */
static corral_status bind_tensor(struct model *m, const arch_tensor *at, uint32_t il,
                                 model_weight *w, corral_error *err) {
    char name[128];
    snprintf(name, sizeof name, at->name, il);
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (at->flags & ARCH_TENSOR_OPTIONAL) return CORRAL_OK;
        return corral_error_set(err, CORRAL_FORMAT,
                                "tensor %s is missing (architecture %s needs it)", name,
                                m->arch->name);
    }
    if (at->flags & ARCH_TENSOR_REJECT)
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "tensor %s means %s, which corral does "
                                "not support",
                                name, at->what);
    const int64_t want0 = dim_value(&m->hp, at->ne[0]), want1 = dim_value(&m->hp, at->ne[1]);
    /* Unused dimensions are 1, so a vector has ne[1] == 1 and nothing beyond. */
    int64_t extra = 1;
    for (uint32_t d = 2; d < t->n_dims; d++) extra *= t->ne[d];
    if (t->ne[0] != want0 || t->ne[1] != want1 || extra != 1)
        return corral_error_set(
            err, CORRAL_FORMAT, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
            (long long)t->ne[0], (long long)t->ne[1], (long long)want0, (long long)want1);
    if ((at->flags & ARCH_TENSOR_F32) && t->type != TENSOR_TYPE_F32)
        return corral_error_set(err, CORRAL_UNSUPPORTED, "tensor %s has type %s; it must be F32",
                                name, tensor_type_name(t->type));
    if (!tensor_type_is_supported(t->type))
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "tensor %s has type %s, which corral cannot compute with", name,
                                tensor_type_name(t->type));
    w->data = t->data;
    w->file_data = t->data;
    w->type = t->type;
    w->n_in = t->ne[0];
    w->n_out = t->ne[1];
    w->traits = tensor_type_get_traits(t->type);
    w->row_bytes = tensor_row_size((tensor_type)t->type, t->ne[0]);
    w->tensor = t;
    m->weight_bytes += t->size;
    return CORRAL_OK;
}

void model__substitute_tensor(struct model *m, const gguf_tensor *t, tensor_type type,
                              const void *data) {
    const tensor_type_traits *traits = tensor_type_get_traits(data ? type : t->type);
    const size_t row_bytes = tensor_row_size(data ? type : (tensor_type)t->type, t->ne[0]);
    const char *base = data ? data : t->data;
    for (size_t i = 0; i < model_n_slots(m); i++) {
        model_weight *w = model_slot(m, i);
        if (w->tensor != t) continue;
        w->type = data ? type : t->type;
        w->traits = traits;
        w->row_bytes = row_bytes;
        w->data = base + w->row0 * (int64_t)row_bytes; /* file_data stays the file's */
        w->panels = 0;
    }
}

/* The slot of a role: a global one, or layer il's. */
static model_weight *model_role_slot(struct model *m, arch_role role, uint32_t il) {
    if (role < ARCH_ROLE_FIRST_LAYER_ROLE) return &m->global[role];
    return &m->layers[(size_t)il * ARCH_N_LAYER_ROLES + (role - ARCH_ROLE_FIRST_LAYER_ROLE)];
}

/* Bind tensor `at` of layer il (0 for globals): into its role's slot, or for a fused tensor, each
 * part into its role's slot as a view of the part's rows (the shape was checked whole, and the
 * parts' rows add up to it). */
static corral_status bind_arch_tensor(struct model *m, const arch_tensor *at, uint32_t il,
                                      corral_error *err) {
    model_weight whole;
    if (at->flags & ARCH_TENSOR_REJECT) return bind_tensor(m, at, il, &whole, err);
    if (at->n_parts == 0) return bind_tensor(m, at, il, model_role_slot(m, at->role, il), err);
    const corral_status st = bind_tensor(m, at, il, &whole, err);
    if (st != CORRAL_OK || !whole.data) return st;
    int64_t row0 = 0;
    for (uint32_t p = 0; p < at->n_parts; p++) {
        model_weight *w = model_role_slot(m, at->parts[p], il);
        *w = whole;
        w->n_out = dim_value(&m->hp, at->part_rows[p]);
        w->row0 = row0;
        w->data = (const char *)whole.data + row0 * (int64_t)whole.row_bytes;
        w->file_data = w->data;
        row0 += w->n_out;
    }
    return CORRAL_OK;
}

static corral_status model_bind_weights(struct model *m, corral_error *err) {
    /* n_vocab comes from the embedding matrix: it is what the logits are indexed by. */
    const gguf_tensor *embd = gguf_find_tensor(m->file, "token_embd.weight");
    if (!embd) return corral_error_set(err, CORRAL_FORMAT, "tensor token_embd.weight is missing");
    if (embd->n_dims != 2 || embd->ne[1] < 1 || embd->ne[1] > (1 << 24))
        return corral_error_set(err, CORRAL_FORMAT, "tensor token_embd.weight has a bad shape");
    m->hp.n_vocab = (uint32_t)embd->ne[1];

    m->layers = calloc((size_t)m->hp.n_layer * ARCH_N_LAYER_ROLES, sizeof *m->layers);
    if (!m->layers) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < m->arch->n_tensors; i++) {
        const arch_tensor *at = &m->arch->tensors[i];
        /* A per-layer name has a %u for the block; a global one none. */
        const int per_layer = strstr(at->name, "%u") != NULL;
        for (uint32_t il = 0; il < (per_layer ? m->hp.n_layer : 1); il++) {
            const corral_status st = bind_arch_tensor(m, at, il, err);
            if (st != CORRAL_OK) return st;
        }
    }
    if (!m->global[ARCH_ROLE_OUTPUT].data) {
        m->global[ARCH_ROLE_OUTPUT] = m->global[ARCH_ROLE_TOKEN_EMBD];
        m->hp.tied_output = 1;
    }
    if (m->global[ARCH_ROLE_ROPE_FREQS].data) {
        m->rope.freq_factors = m->global[ARCH_ROLE_ROPE_FREQS].data;
        m->hp.rope_freq_factors = 1;
    }
    return CORRAL_OK;
}

/*
 * Page sizes for the model file's mapping (gguf_advise_pages). Once the matrices are repacked the
 * file is read only here and there (embedding rows, norms), and a 2 MiB page read in and mapped
 * for a norm of 8 KiB would hold 2 MiB of weights the process never reads again in its resident
 * memory (measured: a TinyLlama Q4_0 run's mapping of the file at 127 MiB resident, against 21
 * with this advice). So the file is sparse but for the matrices the forward pass streams from it
 * in place: types without a panel kernel, matrices of less than a panel, reference mode.
 */
static void model_advise_file_pages(const struct model *m) {
    gguf_advise_pages(m->file, gguf_file_data(m->file), gguf_file_size(m->file), GGUF_PAGES_SPARSE);
    static const arch_role streamed[] = {ARCH_ROLE_ATTN_Q,   ARCH_ROLE_ATTN_K,   ARCH_ROLE_ATTN_V,
                                         ARCH_ROLE_ATTN_OUT, ARCH_ROLE_FFN_GATE, ARCH_ROLE_FFN_UP,
                                         ARCH_ROLE_FFN_DOWN};
    const model_weight *out = &m->global[ARCH_ROLE_OUTPUT];
    if (out->data && !out->panels)
        gguf_advise_pages(m->file, out->data, (size_t)out->n_out * out->row_bytes,
                          GGUF_PAGES_STREAMED);
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        for (size_t k = 0; k < sizeof streamed / sizeof streamed[0]; k++) {
            const model_weight *w = model_layer_weight(m, il, streamed[k]);
            if (w->data && !w->panels)
                gguf_advise_pages(m->file, w->data, (size_t)w->n_out * w->row_bytes,
                                  GGUF_PAGES_STREAMED);
        }
}

model *model_load(const char *path, const model_params *params, corral_error *err) {
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    m->params = params ? *params : model_params_default();
    /* A CORRAL_CPU that names no runnable kernel path stops every load, with its message. */
    if (!kernels_get(err)) goto fail;
    /* Before the mapping: a file replaced in between then reads as changed at a restore. When
     * stat fails the stamp stays zero (never matching) and gguf_open names the problem. */
    (void)image_file_stamp_read(path, &m->file_id, NULL);
    image_fingerprint fp;
    image_fingerprint_init(&fp, "corral-model-file-1");
    corral_error fperr;
    if (image_fingerprint_add_file(&fp, path, &fperr) == CORRAL_OK)
        image_fingerprint_hex(&fp, m->file_fingerprint);
    else if (fperr.status != CORRAL_NOT_FOUND) /* (gguf_open reports a missing file) */
        log_warn("cannot fingerprint the model file: no image of it is cached",
                 LOG_STR("error", fperr.message));
    /* Reads of the mapping that fail (a file truncated under us) become errors (fault.h). */
    if (fault_init(err) != CORRAL_OK) goto fail;
    m->file = gguf_open(path, err);
    if (!m->file) goto fail;

    gguf_str arch;
    if (gguf_get_str(m->file, "general.architecture", &arch, err) != CORRAL_OK) goto fail_named;
    m->arch = arch_find(arch.data, arch.len);
    if (!m->arch) {
        corral_error_set(err, CORRAL_UNSUPPORTED,
                         "unknown architecture '%.*s' (corral supports: %s)",
                         (int)(arch.len > 64 ? 64 : arch.len), arch.data, arch_supported_names());
        goto fail_named;
    }
    snprintf(m->hp.arch, sizeof m->hp.arch, "%s", m->arch->name);
    gguf_str name;
    if (gguf_get_str(m->file, "general.name", &name, NULL) == CORRAL_OK)
        snprintf(m->hp.name, sizeof m->hp.name, "%.*s", (int)(name.len > 127 ? 127 : name.len),
                 name.data);
    if (model_read_hparams(m, err) != CORRAL_OK) goto fail_named;
    if (model_bind_weights(m, err) != CORRAL_OK) goto fail_named;
    m->tok = tok_new_from_gguf(m->file, err);
    if (!m->tok) goto fail_named;
    if ((uint32_t)tok_vocab_size(m->tok) > m->hp.n_vocab) {
        corral_error_set(err, CORRAL_FORMAT,
                         "the tokenizer has %d tokens but token_embd.weight only %u rows",
                         (int)tok_vocab_size(m->tok), m->hp.n_vocab);
        goto fail_named;
    }
    if (model__repack(m, err) != CORRAL_OK) goto fail_named;
    model_advise_file_pages(m);
    log_debug("model loaded", LOG_STR("path", path), LOG_STR("arch", m->hp.arch),
              LOG_UINT("layers", m->hp.n_layer), LOG_UINT("embd", m->hp.n_embd),
              LOG_UINT("vocab", m->hp.n_vocab), LOG_UINT("weight_bytes", m->weight_bytes));
    return m;
fail_named:
    corral_error_prefix(err, "%s", path);
fail:
    model_destroy(&m);
    return NULL;
}

void model_destroy(model **pm) {
    if (!pm || !*pm) return;
    struct model *m = *pm;
    tok_destroy(&m->tok);
    model__packed_destroy(&m->packed);
    free(m->layers);
    free(m->layer_swa);
    free(m->swa_before);
    gguf_destroy(&m->file);
    free(m);
    *pm = NULL;
}

void model_weights_release(model *m) {
    if (!m || m->released) return;
    model__unpack(m);
    gguf_release_pages(m->file);
    m->released = 1;
    log_debug("model weights released", LOG_STR("path", gguf_path(m->file)));
}

const char *model_file_fingerprint(const model *m) {
    return m->file_fingerprint;
}

image_file_change model_file_check(const model *m, corral_error *err) {
    char why[256];
    const image_file_change c =
        image_file_stamp_compare(&m->file_id, gguf_path(m->file), why, sizeof why);
    if (c != IMAGE_FILE_SAME)
        corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                         "%s changed on disk since the model was loaded: %s", gguf_path(m->file),
                         why);
    return c;
}

corral_status model_weights_restore(model *m, corral_error *err) {
    if (!m->released) return CORRAL_OK;
    if (model_file_check(m, err) != IMAGE_FILE_SAME) return CORRAL_FAILED_PRECONDITION;
    const corral_status st = model__repack(m, err);
    if (st != CORRAL_OK) return corral_error_prefix(err, "%s", gguf_path(m->file));
    model_advise_file_pages(m);
    m->released = 0;
    return CORRAL_OK;
}

int model_weights_resident(const model *m) {
    return !m->released;
}

const model_hparams *model_get_hparams(const model *m) {
    return &m->hp;
}

const tokenizer *model_get_tokenizer(const model *m) {
    return m->tok;
}

const gguf_file *model_get_gguf(const model *m) {
    return m->file;
}

uint64_t model_weight_bytes(const model *m) {
    return m->weight_bytes;
}

int model_layer_slides(const model *m, uint32_t il) {
    return il < m->hp.n_layer && m->layer_swa[il];
}

/* ---- KV cache -------------------------------------------------------------------------------- */

/* The rows per KV head of a sliding layer in a cache of n_ctx positions. */
static uint32_t kv_swa_rows(const struct model *m, uint32_t n_ctx) {
    if (m->hp.n_swa_layers == 0) return n_ctx;
    const uint64_t rows = (uint64_t)m->hp.n_swa + KV_WINDOW_SLACK;
    return rows < n_ctx ? (uint32_t)rows : n_ctx;
}

/* Rows of head_dim elements in one of a cache's K or V buffers. */
static uint64_t kv_total_rows(const struct model *m, uint32_t n_ctx) {
    const uint64_t n_full = m->hp.n_layer - m->hp.n_swa_layers;
    return (uint64_t)m->hp.n_head_kv *
           (n_full * n_ctx + (uint64_t)m->hp.n_swa_layers * kv_swa_rows(m, n_ctx));
}

uint64_t kv_cache_bytes_for(const model *m, uint32_t n_ctx, kv_type type) {
    if (n_ctx == 0) n_ctx = m->hp.n_ctx_train;
    return 2 * kv_total_rows(m, n_ctx) * m->hp.head_dim * (type == KV_TYPE_F32 ? 4 : 2);
}

kv_cache *kv_cache_new(const model *m, uint32_t n_ctx, kv_type type, corral_error *err) {
    if (n_ctx == 0) n_ctx = m->hp.n_ctx_train;
    if (n_ctx > m->hp.n_ctx_train) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                         "context of %u tokens exceeds the model's %u", n_ctx, m->hp.n_ctx_train);
        return NULL;
    }
    if (type != KV_TYPE_F16 && type != KV_TYPE_F32) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "unknown KV cache type %d", (int)type);
        return NULL;
    }
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    kv->m = m;
    kv->type = type;
    kv->n_ctx = n_ctx;
    kv->elem_size = type == KV_TYPE_F16 ? 2 : 4;
    kv->n_head_kv = m->hp.n_head_kv;
    kv->head_dim = m->hp.head_dim;
    kv->swa_rows = kv_swa_rows(m, n_ctx);
    kv->pass_max = kv->swa_rows < n_ctx ? kv->swa_rows - m->hp.n_swa + 1 : UINT32_MAX;
    const uint64_t bytes = kv_cache_bytes_for(m, n_ctx, type) / 2;
    if (bytes <= SIZE_MAX) {
        kv->k = malloc((size_t)bytes);
        kv->v = malloc((size_t)bytes);
    }
    if (!kv->k || !kv->v) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cannot allocate a KV cache of %llu bytes",
                         (unsigned long long)(2 * bytes));
        kv_cache_destroy(&kv);
        return NULL;
    }
    return kv;
}

void kv_cache_destroy(kv_cache **pkv) {
    if (!pkv || !*pkv) return;
    free((*pkv)->k);
    free((*pkv)->v);
    free(*pkv);
    *pkv = NULL;
}

uint32_t kv_cache_n_pos(const kv_cache *kv) {
    return kv->n_pos;
}

uint32_t kv_cache_n_ctx(const kv_cache *kv) {
    return kv->n_ctx;
}

uint64_t kv_cache_bytes(const kv_cache *kv) {
    return kv_cache_bytes_for(kv->m, kv->n_ctx, kv->type);
}

kv_type kv_cache_type(const kv_cache *kv) {
    return kv->type;
}

/* The first position whose rows a query at position pos of a sliding layer reads. */
static uint32_t kv_window_start(const struct model *m, uint32_t pos) {
    return pos + 1 > m->hp.n_swa ? pos + 1 - m->hp.n_swa : 0;
}

/* Move rows [from, from + n) of every sliding layer's heads to their row 0. */
static void kv_swa_shift(struct kv_cache *kv, uint32_t from, uint32_t n) {
    const size_t row_bytes = (size_t)kv->head_dim * kv->elem_size;
    for (uint32_t il = 0; il < kv->m->hp.n_layer; il++) {
        if (!kv->m->layer_swa[il]) continue;
        for (uint32_t h = 0; h < kv->n_head_kv; h++) {
            const size_t head =
                (size_t)((char *)kv_cache_row(kv, kv->k, il, h, kv->swa_base) - (char *)kv->k);
            memmove((char *)kv->k + head, (char *)kv->k + head + from * row_bytes, n * row_bytes);
            memmove((char *)kv->v + head, (char *)kv->v + head + from * row_bytes, n * row_bytes);
        }
    }
}

void kv__window_make_room(struct kv_cache *kv, uint32_t first, uint32_t last) {
    if (kv->pass_max == UINT32_MAX || last - kv->swa_base < kv->swa_rows) return;
    /* The positions before first's window are never read again. */
    const uint32_t keep = kv_window_start(kv->m, first);
    kv_swa_shift(kv, keep - kv->swa_base, first - keep);
    kv->swa_base = keep;
}

uint32_t kv_cache_truncate(kv_cache *kv, uint32_t n_pos) {
    if (n_pos >= kv->n_pos) return kv->n_pos;
    /* A sliding layer must still hold the window of the next position, n_pos. */
    if (n_pos > 0 && kv_window_start(kv->m, n_pos) < kv->swa_base) n_pos = 0;
    kv->n_pos = n_pos;
    if (n_pos == 0) kv->swa_base = 0;
    return n_pos;
}

uint32_t kv_cache_layer_first(const kv_cache *kv, uint32_t layer) {
    return layer < kv->m->hp.n_layer ? kv_layer_base(kv, layer) : 0;
}

const void *kv_cache_rows(const kv_cache *kv, uint32_t layer, uint32_t kv_head, int values,
                          size_t *row_bytes) {
    if (layer >= kv->m->hp.n_layer || kv_head >= kv->n_head_kv) return NULL;
    *row_bytes = kv->head_dim * kv->elem_size;
    return kv_cache_row(kv, values ? kv->v : kv->k, layer, kv_head, kv_layer_base(kv, layer));
}

corral_status kv_cache_load_rows(kv_cache *kv, uint32_t layer, uint32_t kv_head, int values,
                                 const void *rows, uint32_t first, uint32_t n, corral_error *err) {
    if (layer >= kv->m->hp.n_layer || kv_head >= kv->n_head_kv || n > kv->n_ctx)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "KV rows for layer %u, head %u and %u positions do not fit this "
                                "cache (%u layers, %u heads, %u positions)",
                                layer, kv_head, n, kv->m->hp.n_layer, kv->n_head_kv, kv->n_ctx);
    const int slides = kv->m->layer_swa[layer];
    if (first > n || (!slides && first != 0) ||
        (slides && (n - first > kv->swa_rows || (n > 0 && first > kv_window_start(kv->m, n)))))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "KV rows of layer %u from position %u to %u do not fit this cache "
                                "(%s layer, %u rows)",
                                layer, first, n, slides ? "a sliding" : "a full",
                                kv_layer_rows(kv, layer));
    if (slides) kv->swa_base = first;
    memcpy(kv_cache_row(kv, values ? kv->v : kv->k, layer, kv_head, first), rows,
           (size_t)(n - first) * kv->head_dim * kv->elem_size);
    kv->n_pos = n;
    return CORRAL_OK;
}

corral_status kv_cache_copy(kv_cache *dst, const kv_cache *src, corral_error *err) {
    if (dst->m != src->m || dst->type != src->type)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "KV caches of different models or types cannot be copied");
    if (src->n_pos > dst->n_ctx)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "destination context (%u) is smaller than the %u positions to copy",
                                dst->n_ctx, src->n_pos);
    const uint32_t n = src->n_pos;
    /* The sliding layers' rows: what src holds, or the newest that dst's rows take (always the
     * window of the next position). */
    uint32_t swa_first = src->swa_base;
    if (n - swa_first > dst->swa_rows) swa_first = n - dst->swa_rows;
    const size_t row_bytes = (size_t)src->head_dim * src->elem_size;
    dst->swa_base = swa_first;
    for (uint32_t il = 0; il < src->m->hp.n_layer; il++) {
        const uint32_t first = src->m->layer_swa[il] ? swa_first : 0;
        const size_t bytes = (size_t)(n - first) * row_bytes;
        for (uint32_t h = 0; h < src->n_head_kv; h++) {
            memcpy(kv_cache_row(dst, dst->k, il, h, first), kv_cache_row(src, src->k, il, h, first),
                   bytes);
            memcpy(kv_cache_row(dst, dst->v, il, h, first), kv_cache_row(src, src->v, il, h, first),
                   bytes);
        }
    }
    dst->n_pos = n;
    return CORRAL_OK;
}

/* ---- runner ---------------------------------------------------------------------------------- */

model_runner *model_runner_new(const model *m, uint32_t max_batch, threadpool *pool,
                               corral_error *err) {
    if (max_batch == 0) max_batch = 512;
    if (max_batch > 65536) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "batch of %u tokens is too large",
                         max_batch);
        return NULL;
    }
    struct model_runner *r = calloc(1, sizeof *r);
    if (!r) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    r->m = m;
    /* Reference mode is the yardstick: scalar kernels throughout. */
    r->ops = m->params.compute == MODEL_COMPUTE_REFERENCE ? kernels_for_path(KERNEL_PATH_SCALAR)
                                                          : kernels_get(err);
    if (!r->ops) {
        free(r);
        return NULL;
    }
    r->max_batch = max_batch;
    r->pool = pool;
    r->n_threads = threadpool_n_threads(pool);
    const size_t T = r->n_threads;
    const model_hparams *hp = &m->hp;
    const size_t B = max_batch;
    const size_t n_q = (size_t)hp->n_head * hp->head_dim,
                 n_kv = (size_t)hp->n_head_kv * hp->head_dim;
    size_t max_in = hp->n_embd;
    if (n_q > max_in) max_in = n_q;
    if (hp->n_ff > max_in) max_in = hp->n_ff;
    r->max_in = max_in;
    int ok =
        (r->x = malloc(B * hp->n_embd * sizeof(float))) &&
        (r->xn = malloc(B * hp->n_embd * sizeof(float))) &&
        (r->q = malloc(B * n_q * sizeof(float))) && (r->k = malloc(B * n_kv * sizeof(float))) &&
        (r->v = malloc(B * n_kv * sizeof(float))) && (r->attn = malloc(B * n_q * sizeof(float))) &&
        (r->tmp = malloc(B * hp->n_embd * sizeof(float))) &&
        (r->gate = malloc(B * hp->n_ff * sizeof(float))) &&
        (r->up = malloc(B * hp->n_ff * sizeof(float))) &&
        (r->scores = malloc(T * KERNEL_ATTN_MAX_HEADS * hp->n_ctx_train * sizeof(float))) &&
        (r->rope_cs = malloc(B * hp->n_rot * sizeof(float))) &&
        (hp->n_swa_layers == 0 || (r->rope_cs_swa = malloc(B * hp->n_rot * sizeof(float)))) &&
        (r->row_f32 = malloc(T * max_in * sizeof(float))) &&
        (r->kv_row = malloc(T * hp->head_dim * sizeof(float))) &&
        (r->tok_id = malloc(B * sizeof *r->tok_id)) &&
        (r->tok_kv = malloc(B * sizeof *r->tok_kv)) &&
        (r->tok_pos = malloc(B * sizeof *r->tok_pos)) &&
        (r->out_tok = malloc(B * sizeof *r->out_tok)) &&
        (r->out_row = malloc(B * sizeof *r->out_row)) &&
        (r->scatter = malloc(T * FORWARD_SCATTER_TOKENS * FORWARD_SCATTER_PANELS *
                             KERNEL_PANEL_ROWS * sizeof(float)));
    /* One quantized-activation buffer per partner type the model's weights use. */
    for (size_t i = 0; ok && i < model_n_slots(m); i++) {
        const model_weight *w = model_slot_at(m, i);
        if (!w->data || w->n_out == 1) continue;
        const tensor_type vt = w->traits->vec_dot_type;
        if (vt == TENSOR_TYPE_F32 || r->act_q[vt]) continue;
        const tensor_type_traits *vtt = tensor_type_get_traits(vt);
        /* Rows are at most max_in long and a multiple of the block size. */
        const size_t bytes =
            B * ((max_in + (size_t)vtt->block_size - 1) / (size_t)vtt->block_size) * vtt->type_size;
        r->act_q[vt] = malloc(bytes);
        r->act_q_size[vt] = bytes;
        ok = r->act_q[vt] != NULL;
    }
    /* The panel kernels' side data of Q8_0 activations, and a row taken out of a panel. */
    if (ok && r->act_q[TENSOR_TYPE_Q8_0])
        ok = (r->act_aux = malloc(B * (max_in / QK8_0) * sizeof *r->act_aux)) != NULL;
    size_t max_row = 0;
    int f16_panels = 0;
    for (size_t i = 0; i < model_n_slots(m); i++) {
        const model_weight *w = model_slot_at(m, i);
        if (w->panels && w->row_bytes > max_row) max_row = w->row_bytes;
        if (w->panels && w->type == TENSOR_TYPE_F16) f16_panels = 1;
    }
    if (ok && max_row > 0) ok = (r->row_q = malloc(max_row)) != NULL;
    if (ok && f16_panels) ok = (r->act_f16_f32 = malloc(B * max_in * sizeof(float))) != NULL;
    if (!ok) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cannot allocate scratch for %u tokens",
                         max_batch);
        model_runner_destroy(&r);
    }
    return r;
}

void model_runner_destroy(model_runner **pr) {
    if (!pr || !*pr) return;
    struct model_runner *r = *pr;
    float *bufs[] = {r->x,       r->xn,          r->q,       r->k,      r->v,
                     r->attn,    r->tmp,         r->gate,    r->up,     r->scores,
                     r->rope_cs, r->rope_cs_swa, r->row_f32, r->kv_row, r->scatter};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->tok_id);
    free(r->tok_kv);
    free(r->tok_pos);
    free(r->out_tok);
    free(r->out_row);
    for (int t = 0; t < TENSOR_TYPE_COUNT; t++) free(r->act_q[t]);
    free(r->act_aux);
    free(r->act_f16_f32);
    free(r->row_q);
    free(r);
    *pr = NULL;
}

/* ---- forward pass ---------------------------------------------------------------------------- */

/* Output norm and projection of n tokens of the current pass into logits: tokens tok[i] (NULL:
 * tokens 0..n-1) into rows[i] (NULL: the rows of logits[n][n_vocab]). One product for all of them,
 * so the output weight is read once per pass however many sequences want logits. */
static void forward_logits(struct model_runner *r, uint32_t n, const uint32_t *tok,
                           float *const *rows, float *logits) {
    const struct model *m = r->m;
    const int64_t n_embd = m->hp.n_embd;
    for (uint32_t i = 0; i < n; i++)
        ops_rms_norm(r->xn + i * n_embd, r->x + (tok ? tok[i] : i) * n_embd,
                     m->global[ARCH_ROLE_OUTPUT_NORM].data, n_embd, m->hp.rms_eps);
    r->epoch++;
    /* One row is a plain product (which keeps the decode kernels' streams); several scatter. */
    if (rows && n == 1)
        forward_matmul(r, rows[0], &m->global[ARCH_ROLE_OUTPUT], r->xn, 1);
    else if (rows)
        forward_matmul_rows(r, rows, &m->global[ARCH_ROLE_OUTPUT], r->xn, n);
    else
        forward_matmul(r, logits, &m->global[ARCH_ROLE_OUTPUT], r->xn, n);
    /* Softcapping (gemma): c * tanh(l / c), as llama.cpp computes it (scale, tanh, scale). */
    const float cap = m->hp.logit_softcap;
    if (cap > 0.0f)
        for (uint32_t i = 0; i < n; i++) {
            float *row = rows ? rows[i] : logits + (size_t)i * m->hp.n_vocab;
            for (uint32_t v = 0; v < m->hp.n_vocab; v++)
                row[v] = tanhf(row[v] * (1.0f / cap)) * cap;
        }
}

/* Tells one model_forward_batch call's checks from every other's (kv_cache.batch_call). */
static _Atomic uint64_t batch_calls;

/* Every check of model_forward_batch, before anything runs. `named`: messages name the sequence
 * (model_forward's one sequence is not named). */
static corral_status batch_check(const struct model_runner *r, const model_seq *seqs,
                                 uint32_t n_seqs, bool named, corral_error *err) {
    const struct model *m = r->m;
    if (m->released)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "the model's weights are released (model_weights_restore first)");
    if (model_fault(m)) return corral_error_set(err, CORRAL_IO, "%s", m->fault_message);
    if (n_seqs > 0 && !seqs)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "no sequences (NULL) for %u", n_seqs);
    const uint64_t call = atomic_fetch_add(&batch_calls, 1) + 1;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const model_seq *q = &seqs[s];
        char who[32] = "";
        if (named) snprintf(who, sizeof who, "sequence %u: ", s);
        if (!q->kv) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%sno KV cache", who);
        if (q->kv->m != m)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "%sthe KV cache belongs to another model", who);
        if (q->kv->batch_call == call)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "%sthe KV cache is an earlier sequence's too (a cache can "
                                    "take one sequence per call)",
                                    who);
        q->kv->batch_call = call;
        q->kv->n_pos_at_call = q->kv->n_pos;
        if (q->n_tokens == 0 || !q->tokens)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%sno tokens", who);
        if ((uint64_t)q->kv->n_pos + q->n_tokens > q->kv->n_ctx)
            return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                    "%s%u more tokens do not fit: context holds %u of %u positions",
                                    who, q->n_tokens, q->kv->n_pos, q->kv->n_ctx);
        for (uint32_t i = 0; i < q->n_tokens; i++)
            if (q->tokens[i] < 0 || (uint32_t)q->tokens[i] >= m->hp.n_vocab)
                return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                        "%stoken id %d at index %u is outside the vocabulary (%u)",
                                        who, q->tokens[i], i, m->hp.n_vocab);
    }
    return CORRAL_OK;
}

/*
 * Run checked sequences in passes of up to max_batch tokens. A pass takes the sequences in order,
 * as many tokens of each as still fit: a sequence that does not fit whole is cut, and its other
 * tokens start the next pass, which sees the first ones in its cache (n_pos advances at the end of
 * every pass, so a token's position is always its cache's n_pos plus its index in the pass's part
 * of the sequence). After each pass the sequences that ended in it and want logits get them, in
 * one output product. all_logits (one sequence only: model_forward's MODEL_LOGITS_ALL) takes the
 * logits of every token instead.
 */
static void batch_run(struct model_runner *r, const model_seq *seqs, uint32_t n_seqs,
                      float *all_logits) {
    const struct model *m = r->m;
    uint32_t s = 0, i = 0; /* the next token to run: sequence s, its token i */
    size_t done = 0;       /* tokens run so far (all_logits) */
    while (s < n_seqs) {
        uint32_t n = 0, n_out = 0;
        while (s < n_seqs && n < r->max_batch) {
            const model_seq *q = &seqs[s];
            const uint32_t left = q->n_tokens - i, room = r->max_batch - n;
            uint32_t take = left < room ? left : room;
            /* A cache with sliding layers takes at most pass_max tokens a pass, and makes room for
             * them before it (kv__window_make_room). */
            if (take > q->kv->pass_max) take = q->kv->pass_max;
            kv__window_make_room(q->kv, q->kv->n_pos, q->kv->n_pos + take - 1);
            for (uint32_t j = 0; j < take; j++) {
                r->tok_id[n + j] = q->tokens[i + j];
                r->tok_kv[n + j] = q->kv;
                r->tok_pos[n + j] = q->kv->n_pos + j;
            }
            n += take;
            i += take;
            if (i < q->n_tokens) break; /* the pass is full; the rest starts the next one */
            if (q->logits) {
                r->out_tok[n_out] = n - 1;
                r->out_row[n_out++] = q->logits;
            }
            s++;
            i = 0;
        }
        const forward_batch b = {
            .n_tok = n, .tokens = r->tok_id, .kv = r->tok_kv, .pos = r->tok_pos};
        m->arch->forward(r, &b);
        if (all_logits)
            forward_logits(r, n, NULL, NULL, all_logits + done * m->hp.n_vocab);
        else if (n_out > 0)
            forward_logits(r, n_out, r->out_tok, r->out_row, NULL);
        done += n;
    }
}

/* Where the fault at addr lies: the model file's mapping or the repacked image's; NULL for
 * neither. *offset is the byte of that file. */
static const gguf_file *fault_file(const struct model *m, uintptr_t addr, uint64_t *offset) {
    const gguf_file *files[2] = {m->file, model__packed_gguf(m)};
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < 2; i++) {
        if (!files[i]) continue;
        const uintptr_t base = (uintptr_t)gguf_file_data(files[i]);
        const uintptr_t end = base + ((uintptr_t)gguf_file_size(files[i]) + page - 1) / page * page;
        if (addr >= base && addr < end) {
            *offset = (uint64_t)(addr - base);
            return files[i];
        }
    }
    return NULL;
}

corral_status model_note_fault(const model *m, const fault_info *fi, corral_error *err) {
    char message[CORRAL_ERROR_MESSAGE_MAX];
    uint64_t offset = 0;
    const gguf_file *f = fault_file(m, fi->addr, &offset);
    if (!f) {
        snprintf(message, sizeof message,
                 "%s: a read failed (SIGBUS: %s) at an address outside the model's mapped files; "
                 "the model is not used again",
                 gguf_path(m->file), fault_code_text(fi->code));
    } else {
        struct stat st;
        char now[96];
        if (stat(gguf_path(f), &st) == 0)
            snprintf(now, sizeof now, "it is now %llu bytes", (unsigned long long)st.st_size);
        else
            snprintf(now, sizeof now, "it is gone (%s)", strerror(errno));
        snprintf(message, sizeof message,
                 "%s: reading the weights failed at byte %llu (SIGBUS: %s); the file had %llu "
                 "bytes when it was loaded and %s: it was truncated or changed while in use",
                 gguf_path(f), (unsigned long long)offset, fault_code_text(fi->code),
                 (unsigned long long)gguf_file_size(f), now);
    }
    /* The first fault names the model's failure for good; later ones report their own. */
    struct model *mm = (struct model *)m;
    int none = 0;
    if (atomic_compare_exchange_strong(&mm->faulted, &none, 1)) {
        snprintf(mm->fault_message, sizeof mm->fault_message, "%s", message);
        atomic_store(&mm->faulted, 2);
    }
    log_warn("model weights unreadable", LOG_STR("error", message));
    return corral_error_set(err, CORRAL_IO, "%s", message);
}

const char *model_fault(const model *m) {
    return atomic_load(&m->faulted) == 2 ? m->fault_message : NULL;
}

/* batch_run under a fault guard (fault.h). A read of the weights that faults — on this thread,
 * or on a pool thread, whose fault the pool hands on here once the run is over — cuts the pass
 * short: no lock is held and nothing was allocated, every pool run is complete, and what the pass
 * wrote is discarded here: each cache's positions go back to what they were when the call began
 * (rows past n_pos are never read), the quantized activations are forgotten, and the logits are
 * undefined (the call fails). The model is marked faulted (model_note_fault). */
static corral_status batch_run_guarded(struct model_runner *r, const model_seq *seqs,
                                       uint32_t n_seqs, float *all_logits, corral_error *err) {
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        batch_run(r, seqs, n_seqs, all_logits);
        fault_guard_leave(&g);
        return CORRAL_OK;
    }
    for (uint32_t s = 0; s < n_seqs; s++) seqs[s].kv->n_pos = seqs[s].kv->n_pos_at_call;
    memset(r->act_cached, 0, sizeof r->act_cached);
    r->epoch++;
    return model_note_fault(r->m, &g.info, err);
}

corral_status model_forward(model_runner *r, kv_cache *kv, const int32_t *tokens, uint32_t n_tokens,
                            model_logits which, float *logits, corral_error *err) {
    if (kv->m != r->m)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the KV cache belongs to another model");
    if (r->m->released)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "the model's weights are released (model_weights_restore first)");
    if (n_tokens == 0) return CORRAL_OK;
    const model_seq seq = {.kv = kv,
                           .tokens = tokens,
                           .n_tokens = n_tokens,
                           .logits = which == MODEL_LOGITS_LAST ? logits : NULL};
    const corral_status st = batch_check(r, &seq, 1, false, err);
    if (st != CORRAL_OK) return st;
    return batch_run_guarded(r, &seq, 1, which == MODEL_LOGITS_ALL ? logits : NULL, err);
}

corral_status model_forward_batch(model_runner *r, const model_seq *seqs, uint32_t n_seqs,
                                  corral_error *err) {
    const corral_status st = batch_check(r, seqs, n_seqs, true, err);
    if (st != CORRAL_OK) return st;
    return batch_run_guarded(r, seqs, n_seqs, NULL, err);
}
