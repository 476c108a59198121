/*
 * lora.c — opening LoRA adapters: the llama.cpp GGUF reader, the Hugging Face PEFT reader
 * (adapter_config.json and safetensors), the mapping of PEFT module names onto GGUF tensors, and
 * the checks of every target against the base model (formats and rules in lora.h).
 *
 * Both readers end in the same place: a sorted array of lora_target, each pointing into the
 * adapter's mapped file, with the layout and permutation that lora_adapter_factors applies when
 * the merge asks for f32 factors. Nothing is converted at open: an adapter is as cheap to hold as
 * its mapping.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/log.h"
#include "corral/tensor.h"
#include "adapter_json.h"
#include "lora_impl.h"

/* Longest adapter_config.json read (real ones are about 1 KB). */
#define LORA_CONFIG_MAX   (16u * 1024u * 1024u)
/* Ranks above this are not low-rank any more (and would make the factor buffers huge). */
#define LORA_RANK_MAX     65536u
/* Steps a rank_pattern / alpha_pattern match may take before it is called too complex. */
#define PATTERN_STEPS_MAX 1000000L
/* Longest rank_pattern / alpha_pattern key: the matcher recurses once per atom, so this bounds
 * its stack (about 100 KB); real keys are module names of a few dozen bytes. */
#define PATTERN_KEY_MAX   1024u

/* ---- the base model ---------------------------------------------------------------------------
 */

/* What the readers need to know about the base. */
typedef struct base_info {
    const gguf_file *f;
    const char *path;
    char arch[32];
    uint32_t n_head, n_head_kv;
} base_info;

static corral_status base_info_read(const gguf_file *f, base_info *b, corral_error *err) {
    memset(b, 0, sizeof *b);
    b->f = f;
    b->path = gguf_path(f);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, NULL) != CORRAL_OK || arch.len == 0 ||
        arch.len >= sizeof b->arch) {
        return corral_error_set(err, CORRAL_FORMAT, "base model %s: no general.architecture",
                                b->path);
    }
    memcpy(b->arch, arch.data, (size_t)arch.len);
    char key[96];
    snprintf(key, sizeof key, "%s.attention.head_count", b->arch);
    if (gguf_get_u32(f, key, &b->n_head, NULL) != CORRAL_OK) b->n_head = 0;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", b->arch);
    if (gguf_get_u32(f, key, &b->n_head_kv, NULL) != CORRAL_OK) b->n_head_kv = b->n_head;
    return CORRAL_OK;
}

/* ---- targets ----------------------------------------------------------------------------------
 */

static void targets_free(lora_target *t, uint32_t n) {
    for (uint32_t i = 0; t && i < n; i++) free(t[i].name);
    free(t);
}

void lora_adapter_destroy(lora_adapter **ap) {
    if (!ap || !*ap) return;
    lora_adapter *a = *ap;
    targets_free(a->targets, a->n_targets);
    gguf_destroy(&a->gguf);
    safetensors_destroy(&a->st);
    free(a->path);
    free(a);
    *ap = NULL;
}

lora_format lora_adapter_format(const lora_adapter *a) {
    return a->format;
}

const char *lora_adapter_path(const lora_adapter *a) {
    return a->path;
}

uint32_t lora_adapter_target_count(const lora_adapter *a) {
    return a ? a->n_targets : 0;
}

corral_status lora_adapter_target(const lora_adapter *a, uint32_t i, lora_target_info *out) {
    if (!a || i >= a->n_targets) {
        return corral_error_set(NULL, CORRAL_INVALID_ARGUMENT, "target out of range");
    }
    const lora_target *t = &a->targets[i];
    *out = (lora_target_info){t->name, t->rank, t->alpha, t->scaling, t->n_in, t->n_out};
    return CORRAL_OK;
}

int32_t lora_adapter_find_target(const lora_adapter *a, const char *tensor) {
    if (!a || !tensor) return -1;
    uint32_t lo = 0, hi = a->n_targets;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(a->targets[mid].name, tensor);
        if (c == 0) return (int32_t)mid;
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return -1;
}

static int target_cmp(const void *x, const void *y) {
    return strcmp(((const lora_target *)x)->name, ((const lora_target *)y)->name);
}

/* Row r of a matrix into dst (cols floats). The row is copied to an aligned buffer first: the
 * type's kernel may read it as floats or halves. */
static void matrix_row_f32(const lora_matrix *m, int64_t r, float *dst, void *scratch) {
    const tensor_type_traits *tt = tensor_type_get_traits(m->type);
    memcpy(scratch, m->data + (size_t)r * m->row_bytes, m->row_bytes);
    tt->to_float(scratch, dst, m->cols);
}

/* GGUF row g of a Q or K projection with `groups` heads comes from Hugging Face row
 * h·d + j·(d/2) + i, where g = h·d + 2i + j (llama.cpp's convert_hf_to_gguf permute). */
static int64_t permuted_row(int64_t g, int64_t n_rows, uint32_t groups) {
    int64_t d = n_rows / groups;
    int64_t h = g / d, r = g % d;
    return h * d + (r % 2) * (d / 2) + r / 2;
}

corral_status lora_adapter_factors(const lora_adapter *a, uint32_t i, float *left, float *right,
                                   corral_error *err) {
    if (!a || i >= a->n_targets || !left || !right) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_adapter_factors: bad argument");
    }
    const lora_target *t = &a->targets[i];
    size_t r = t->rank;
    size_t scratch_bytes = t->a.row_bytes > t->b.row_bytes ? t->a.row_bytes : t->b.row_bytes;
    int64_t max_cols = t->a.cols > t->b.cols ? t->a.cols : t->b.cols;
    void *scratch = malloc(scratch_bytes + 16);
    float *row = malloc((size_t)max_cols * sizeof *row);
    if (!scratch || !row) {
        free(scratch);
        free(row);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: tensor '%s': out of memory",
                                a->path, t->name);
    }
    switch (t->layout) {
        case LORA_LAYOUT_LINEAR:
            /* right = a (r x n_in); left = b (n_out x r), rows permuted when asked. */
            for (size_t k = 0; k < r; k++)
                matrix_row_f32(&t->a, (int64_t)k, right + k * t->n_in, scratch);
            for (int64_t o = 0; o < t->n_out; o++) {
                int64_t src = t->permute_groups ? permuted_row(o, t->n_out, t->permute_groups) : o;
                matrix_row_f32(&t->b, src, left + (size_t)o * r, scratch);
            }
            break;
        case LORA_LAYOUT_GGUF_EMBD:
            /* left = a (n_vocab x r); right = b^T (b is n_embd x r). */
            for (int64_t o = 0; o < t->n_out; o++)
                matrix_row_f32(&t->a, o, left + (size_t)o * r, scratch);
            for (int64_t e = 0; e < t->n_in; e++) {
                matrix_row_f32(&t->b, e, row, scratch);
                for (size_t k = 0; k < r; k++) right[k * t->n_in + e] = row[k];
            }
            break;
        case LORA_LAYOUT_PEFT_EMBD:
            /* left = a^T (a is r x n_vocab); right = b^T (b is n_embd x r). */
            for (size_t k = 0; k < r; k++) {
                matrix_row_f32(&t->a, (int64_t)k, row, scratch);
                for (int64_t o = 0; o < t->n_out; o++) left[(size_t)o * r + k] = row[o];
            }
            for (int64_t e = 0; e < t->n_in; e++) {
                matrix_row_f32(&t->b, e, row, scratch);
                for (size_t k = 0; k < r; k++) right[k * t->n_in + e] = row[k];
            }
            break;
    }
    free(scratch);
    free(row);
    /* A NaN or infinity would silently poison every output of the merged model. */
    size_t n_left = (size_t)t->n_out * r, n_right = r * (size_t)t->n_in;
    for (size_t k = 0; k < n_left + n_right; k++) {
        float v = k < n_left ? left[k] : right[k - n_left];
        if (!isfinite(v)) {
            return corral_error_set(
                err, CORRAL_FORMAT, "adapter %s: tensor '%s': lora_%s holds a non-finite value",
                a->path, t->name, (k < n_left) == (t->layout != LORA_LAYOUT_LINEAR) ? "a" : "b");
        }
    }
    return CORRAL_OK;
}

/* Checks the base tensor a target changes: present, 2-D, re-quantizable. */
static corral_status check_base_tensor(const char *adapter, const base_info *base, const char *name,
                                       const gguf_tensor **out, corral_error *err) {
    const gguf_tensor *w = gguf_find_tensor(base->f, name);
    if (!w && strcmp(name, "output.weight") == 0 &&
        gguf_find_tensor(base->f, "token_embd.weight")) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "adapter %s: tensor 'output.weight': the base model %s ties its "
                                "output projection to token_embd.weight, so an adapter on the "
                                "output (lm_head) alone cannot be merged",
                                adapter, base->path);
    }
    if (!w) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "adapter %s: tensor '%s' does not exist in the base model %s "
                                "(wrong base model?)",
                                adapter, name, base->path);
    }
    if (w->n_dims != 2) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "adapter %s: base tensor '%s' has %" PRIu32
                                " dimensions; LoRA targets matrices",
                                adapter, name, w->n_dims);
    }
    const tensor_type_traits *tt = tensor_type_get_traits(w->type);
    if (!tt || !tt->to_float || !tt->from_float) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "adapter %s: base tensor '%s' is %s, which corral cannot "
                                "re-quantize",
                                adapter, name, tensor_type_name(w->type));
    }
    *out = w;
    return CORRAL_OK;
}

/* Checks a target's factor shapes against each other and the base tensor w, and completes it.
 * a and b must already be set; `what_a` / `what_b` name them in messages. */
static corral_status check_target(const char *adapter, lora_target *t, const gguf_tensor *w,
                                  const char *what_a, const char *what_b, corral_error *err) {
    int64_t rank_a, rank_b, outer_a, outer_b; /* rank as stored in a and b; their other dims */
    switch (t->layout) {
        case LORA_LAYOUT_LINEAR: /* a r x n_in, b n_out x r */
            rank_a = t->a.rows, outer_a = t->a.cols;
            rank_b = t->b.cols, outer_b = t->b.rows;
            break;
        case LORA_LAYOUT_GGUF_EMBD: /* a n_vocab x r, b n_embd x r */
            rank_a = t->a.cols, outer_a = t->a.rows;
            rank_b = t->b.cols, outer_b = t->b.rows;
            break;
        default: /* PEFT embedding: a r x n_vocab, b n_embd x r */
            rank_a = t->a.rows, outer_a = t->a.cols;
            rank_b = t->b.cols, outer_b = t->b.rows;
            break;
    }
    if (rank_a != rank_b) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "adapter %s: tensor '%s': rank mismatch between A and B: %s has "
                                "rank %" PRId64 " but %s has rank %" PRId64,
                                adapter, t->name, what_a, rank_a, what_b, rank_b);
    }
    if (rank_a < 1 || (uint64_t)rank_a > LORA_RANK_MAX) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "adapter %s: tensor '%s': rank %" PRId64 " is outside 1..%u",
                                adapter, t->name, rank_a, LORA_RANK_MAX);
    }
    t->n_in = w->ne[0];
    t->n_out = w->ne[1];
    /* The base's matrix is n_out rows of n_in; embeddings are n_vocab rows of n_embd. */
    bool embd = t->layout != LORA_LAYOUT_LINEAR;
    int64_t want_a = embd ? t->n_out : t->n_in, want_b = embd ? t->n_in : t->n_out;
    if (outer_a != want_a || outer_b != want_b) {
        return corral_error_set(
            err, CORRAL_INVALID_ARGUMENT,
            "adapter %s: tensor '%s': shape mismatch: %s is %" PRId64 " x %" PRId64
            " and %s is %" PRId64 " x %" PRId64 " (rows x columns), which do not fit the base "
            "tensor of %" PRId64 " rows x %" PRId64 " columns (wrong base model?)",
            adapter, t->name, what_a, t->a.rows, t->a.cols, what_b, t->b.rows, t->b.cols, t->n_out,
            t->n_in);
    }
    t->rank = (uint32_t)rank_a;
    return CORRAL_OK;
}

/* ---- llama.cpp GGUF adapters -------------------------------------------------------------------
 */

static bool ends_with(const char *s, size_t len, const char *suffix) {
    size_t n = strlen(suffix);
    return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

/* A GGUF tensor as a matrix (rows = ne[1], cols = ne[0]). */
static corral_status gguf_matrix(const char *adapter, const gguf_tensor *t, lora_matrix *m,
                                 corral_error *err) {
    const tensor_type_traits *tt = tensor_type_get_traits(t->type);
    if (t->n_dims != 2) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "adapter %s: tensor '%.*s' has %" PRIu32
                                " dimensions, LoRA factors have 2",
                                adapter, (int)t->name.len, t->name.data, t->n_dims);
    }
    if (!tt || !tt->to_float) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "adapter %s: tensor '%.*s' is %s, which corral cannot read",
                                adapter, (int)t->name.len, t->name.data, tensor_type_name(t->type));
    }
    m->data = t->data;
    m->type = t->type;
    m->cols = t->ne[0];
    m->rows = t->ne[1];
    m->row_bytes = tensor_row_size((tensor_type)t->type, t->ne[0]);
    return CORRAL_OK;
}

static corral_status gguf_str_expect(const char *adapter, const gguf_file *f, const char *key,
                                     const char *want, corral_status status, const char *hint,
                                     corral_error *err) {
    gguf_str s;
    if (gguf_get_str(f, key, &s, NULL) != CORRAL_OK) {
        return corral_error_set(err, CORRAL_FORMAT, "adapter %s: no %s (not a LoRA adapter)",
                                adapter, key);
    }
    if (!gguf_str_eq(s, want)) {
        return corral_error_set(err, status, "adapter %s: %s is '%.*s', %s", adapter, key,
                                (int)(s.len > 64 ? 64 : s.len), s.data, hint);
    }
    return CORRAL_OK;
}

/* One lora_a / lora_b pair being collected. */
typedef struct gguf_pair {
    char *name;
    const gguf_tensor *a, *b;
} gguf_pair;

static int pair_cmp(const void *x, const void *y) {
    return strcmp(((const gguf_pair *)x)->name, ((const gguf_pair *)y)->name);
}

static corral_status open_gguf(lora_adapter *ad, const base_info *base, corral_error *err) {
    const char *path = ad->path;
    ad->gguf = gguf_open(path, err);
    if (!ad->gguf) return corral_error_prefix(err, "adapter");
    const gguf_file *f = ad->gguf;
    corral_status st = gguf_str_expect(path, f, "general.type", "adapter", CORRAL_FORMAT,
                                       "not 'adapter' (is this a model?)", err);
    if (st == CORRAL_OK) {
        st = gguf_str_expect(path, f, "adapter.type", "lora", CORRAL_UNSUPPORTED,
                             "only 'lora' adapters are supported", err);
    }
    if (st != CORRAL_OK) return st;
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, NULL) != CORRAL_OK) {
        return corral_error_set(err, CORRAL_FORMAT, "adapter %s: no general.architecture", path);
    }
    if (!gguf_str_eq(arch, base->arch)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "adapter %s: wrong architecture: the adapter is for '%.*s' but "
                                "the base model %s is '%s'",
                                path, (int)(arch.len > 32 ? 32 : arch.len), arch.data, base->path,
                                base->arch);
    }
    if (gguf_find_key(f, "adapter.alora.invocation_tokens") >= 0) {
        return corral_error_set(
            err, CORRAL_UNSUPPORTED,
            "adapter %s: activated LoRA (aLoRA, adapter.alora.invocation_tokens)"
            " is not supported: it applies only after its invocation tokens "
            "and cannot be merged",
            path);
    }
    float alpha = 0.0f;
    if (gguf_find_key(f, "adapter.lora.alpha") >= 0 &&
        gguf_get_f32(f, "adapter.lora.alpha", &alpha, err) != CORRAL_OK) {
        return corral_error_prefix(err, "adapter %s", path);
    }
    if (!isfinite(alpha)) {
        return corral_error_set(err, CORRAL_FORMAT, "adapter %s: adapter.lora.alpha is not finite",
                                path);
    }

    uint64_t n = gguf_tensor_count(f);
    gguf_pair *pairs = calloc(n ? n : 1, sizeof *pairs);
    if (!pairs)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
    uint64_t n_pairs = 0;
    /* Collect: each tensor is "<base>.lora_a" or "<base>.lora_b" (or an ignored norm). */
    gguf_pair *half = calloc(n ? n : 1, sizeof *half);
    uint64_t n_half = 0;
    if (!half) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
    for (uint64_t i = 0; st == CORRAL_OK && i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        bool is_a = ends_with(t->name.data, (size_t)t->name.len, ".lora_a");
        bool is_b = ends_with(t->name.data, (size_t)t->name.len, ".lora_b");
        if (!is_a && !is_b) {
            if (ends_with(t->name.data, (size_t)t->name.len, "_norm.weight")) {
                char nm[128];
                snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len > 120 ? 120 : t->name.len),
                         t->name.data);
                log_warn("LoRA norm tensor ignored (llama.cpp ignores it too)",
                         LOG_STR("adapter", path), LOG_STR("tensor", nm));
                continue;
            }
            st = corral_error_set(err, CORRAL_FORMAT,
                                  "adapter %s: tensor '%.*s' has an unexpected suffix (LoRA "
                                  "tensors end in .lora_a or .lora_b)",
                                  path, (int)(t->name.len > 96 ? 96 : t->name.len), t->name.data);
            break;
        }
        half[n_half].name = strndup(t->name.data, (size_t)t->name.len - 7);
        if (!half[n_half].name) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
            break;
        }
        if (is_a) {
            half[n_half].a = t;
        } else {
            half[n_half].b = t;
        }
        n_half++;
    }
    /* Pair the halves by base name: sorted, an a and a b with the same name are adjacent. */
    if (st == CORRAL_OK) qsort(half, n_half, sizeof *half, pair_cmp);
    for (uint64_t i = 0; st == CORRAL_OK && i < n_half; i++) {
        gguf_pair p = half[i];
        half[i].name = NULL;
        if (i + 1 < n_half && strcmp(half[i + 1].name, p.name) == 0) {
            if (!p.a) p.a = half[i + 1].a;
            if (!p.b) p.b = half[i + 1].b;
            free(half[i + 1].name);
            half[i + 1].name = NULL;
            i++;
        }
        pairs[n_pairs++] = p;
        if (!p.a || !p.b) {
            st = corral_error_set(
                err, CORRAL_FORMAT, "adapter %s: tensor '%s': missing %s.%s (its %s is present)",
                path, p.name, p.name, p.a ? "lora_b" : "lora_a", p.a ? "lora_a" : "lora_b");
        }
    }
    for (uint64_t i = 0; half && i < n_half; i++) free(half[i].name);
    free(half);

    if (st == CORRAL_OK && n_pairs == 0) {
        st = corral_error_set(err, CORRAL_FORMAT, "adapter %s: no lora_a / lora_b tensors", path);
    }
    if (st == CORRAL_OK) {
        ad->targets = calloc(n_pairs, sizeof *ad->targets);
        if (!ad->targets) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
        }
    }
    for (uint64_t i = 0; st == CORRAL_OK && i < n_pairs; i++) {
        lora_target *t = &ad->targets[ad->n_targets];
        t->name = pairs[i].name;
        pairs[i].name = NULL;
        ad->n_targets++;
        bool embd = strcmp(t->name, "token_embd.weight") == 0;
        t->layout = embd ? LORA_LAYOUT_GGUF_EMBD : LORA_LAYOUT_LINEAR;
        const gguf_tensor *w = NULL;
        char what_a[160], what_b[160];
        snprintf(what_a, sizeof what_a, "%s.lora_a", t->name);
        snprintf(what_b, sizeof what_b, "%s.lora_b", t->name);
        st = gguf_matrix(path, pairs[i].a, &t->a, err);
        if (st == CORRAL_OK) st = gguf_matrix(path, pairs[i].b, &t->b, err);
        if (st == CORRAL_OK) st = check_base_tensor(path, base, t->name, &w, err);
        if (st == CORRAL_OK) st = check_target(path, t, w, what_a, what_b, err);
        if (st == CORRAL_OK) {
            /* llama.cpp: scale * alpha / rank when alpha is set, the bare scale otherwise. */
            t->alpha = alpha;
            t->scaling = alpha != 0.0f ? (float)((double)alpha / (double)t->rank) : 1.0f;
        }
    }
    for (uint64_t i = 0; i < n_pairs; i++) free(pairs[i].name);
    free(pairs);
    return st;
}

/* ---- PEFT: patterns -----------------------------------------------------------------------------
 *
 * rank_pattern / alpha_pattern keys are Python regular expressions that PEFT matches with
 * re.match(rf"(.*\.)?({key})$", module): the key must match the whole module name, or the part of
 * it after some '.'. The matcher below is a small backtracking one for the subset real configs use
 * (module names, often with '.', classes and '*'): literals, '.', '\' escapes (\d \w \s and escaped
 * punctuation), [classes] with ranges and '^', the quantifiers '*', '+', '?', and '^' / '$' at the
 * ends. Groups, alternation and counted repetition are refused by name when the config is read.
 * A step budget bounds the backtracking.
 */

typedef struct pattern_run {
    long steps;
    bool too_complex;
} pattern_run;

/* Length of the atom at re (an escape, a class, or one character). */
static size_t atom_len(const char *re) {
    if (re[0] == '\\') return re[1] ? 2 : 1;
    if (re[0] == '[') {
        size_t i = 1;
        if (re[i] == '^') i++;
        if (re[i] == ']') i++; /* a leading ']' is literal */
        while (re[i] && re[i] != ']') i += re[i] == '\\' && re[i + 1] ? 2 : 1;
        return re[i] == ']' ? i + 1 : i;
    }
    return 1;
}

static bool class_escape(char e, unsigned char c, bool *matched) {
    switch (e) {
        case 'd':
            *matched = isdigit(c) != 0;
            return true;
        case 'D':
            *matched = isdigit(c) == 0;
            return true;
        case 'w':
            *matched = isalnum(c) || c == '_';
            return true;
        case 'W':
            *matched = !(isalnum(c) || c == '_');
            return true;
        case 's':
            *matched = isspace(c) != 0;
            return true;
        case 'S':
            *matched = isspace(c) == 0;
            return true;
        default:
            return false;
    }
}

static bool atom_matches(const char *re, size_t len, unsigned char c) {
    bool m;
    if (re[0] == '.') return true;
    if (re[0] == '\\') {
        if (len < 2) return c == '\\';
        if (class_escape(re[1], c, &m)) return m;
        return c == (unsigned char)re[1];
    }
    if (re[0] != '[') return c == (unsigned char)re[0];
    size_t i = 1;
    bool negate = re[i] == '^';
    if (negate) i++;
    bool found = false;
    size_t end = len - 1; /* the closing ']' */
    while (i < end) {
        unsigned char lo;
        if (re[i] == '\\' && i + 1 < end) {
            if (class_escape(re[i + 1], c, &m)) {
                found |= m;
                i += 2;
                continue;
            }
            lo = (unsigned char)re[i + 1];
            i += 2;
        } else {
            lo = (unsigned char)re[i];
            i++;
        }
        if (i + 1 < end && re[i] == '-') {
            unsigned char hi = (unsigned char)re[i + 1];
            i += 2;
            if (c >= lo && c <= hi) found = true;
        } else if (c == lo) {
            found = true;
        }
    }
    return found != negate;
}

/* Does re match the whole of s[0..n)? */
static bool pattern_here(const char *re, const char *s, size_t n, pattern_run *run) {
    if (++run->steps > PATTERN_STEPS_MAX) {
        run->too_complex = true;
        return false;
    }
    if (re[0] == '\0') return n == 0;
    if (re[0] == '$' && re[1] == '\0') return n == 0;
    size_t al = atom_len(re);
    const char *next = re + al;
    char q = *next;
    if (q == '*' || q == '+' || q == '?') {
        size_t min = q == '+' ? 1 : 0, max = q == '?' ? 1 : n;
        size_t k = 0;
        while (k < max && k < n && atom_matches(re, al, (unsigned char)s[k])) k++;
        for (size_t j = k + 1; j-- > min;) {
            if (pattern_here(next + 1, s + j, n - j, run)) return true;
            if (run->too_complex) return false;
        }
        return false;
    }
    if (n > 0 && atom_matches(re, al, (unsigned char)s[0])) {
        return pattern_here(next, s + 1, n - 1, run);
    }
    return false;
}

/* PEFT's (.*\.)?(key)$ against a module name. */
static bool pattern_match(const char *key, const char *module, pattern_run *run) {
    size_t n = strlen(module);
    if (key[0] == '^') return pattern_here(key + 1, module, n, run);
    for (size_t start = 0; start <= n; start++) {
        if (start > 0 && module[start - 1] != '.') continue;
        if (pattern_here(key, module + start, n - start, run)) return true;
        if (run->too_complex) return false;
    }
    return false;
}

/* Refuses the regular-expression features the matcher does not have, and malformed ones. */
static corral_status pattern_check(const char *config, const char *field, const char *key,
                                   corral_error *err) {
    if (strlen(key) > PATTERN_KEY_MAX) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "%s: %s key '%.96s...' is longer than %u bytes", config, field, key,
                                PATTERN_KEY_MAX);
    }
    for (size_t i = 0; key[i];) {
        char c = key[i];
        if (c == '(' || c == ')' || c == '|' || c == '{' || c == '}') {
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: %s key '%.96s': '%c' (regular-expression groups, "
                                    "alternation and counted repetition) is not supported",
                                    config, field, key, c);
        }
        if ((c == '*' || c == '+' || c == '?') && (i == 0 || key[i - 1] == '^')) {
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s: %s key '%.96s': '%c' has nothing to repeat", config, field,
                                    key, c);
        }
        if (c == '^' && i != 0) {
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: %s key '%.96s': '^' is only supported at the start",
                                    config, field, key);
        }
        size_t al = atom_len(key + i);
        if (c == '[' && key[i + al - 1] != ']') {
            return corral_error_set(err, CORRAL_FORMAT, "%s: %s key '%.96s': unterminated '['",
                                    config, field, key);
        }
        if (c == '$' && key[i + 1] != '\0') {
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: %s key '%.96s': '$' is only supported at the end", config,
                                    field, key);
        }
        i += al;
        if (key[i] == '*' || key[i] == '+' || key[i] == '?') {
            i++;
            if (key[i] == '*' || key[i] == '+' || key[i] == '?') {
                return corral_error_set(err, CORRAL_UNSUPPORTED,
                                        "%s: %s key '%.96s': stacked or lazy quantifiers are not "
                                        "supported",
                                        config, field, key);
            }
        }
    }
    return CORRAL_OK;
}

/* The value of the first key of pattern (an object) that matches module, as PEFT takes the first
 * match in key order; *found 0 when none does. */
static corral_status pattern_lookup(const char *config, const char *field, const json_t *pattern,
                                    const char *module, double *out, int *found,
                                    corral_error *err) {
    *found = 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)pattern, key, value) {
        pattern_run run = {0};
        bool m = pattern_match(key, module, &run);
        if (run.too_complex) {
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: %s key '%.96s' is too complex to match", config, field,
                                    key);
        }
        if (m) {
            adapter_json_f64(value, out);
            *found = 1;
            return CORRAL_OK;
        }
    }
    return CORRAL_OK;
}

/* ---- PEFT: adapter_config.json ------------------------------------------------------------------
 */

typedef struct peft_config {
    json_t *doc;
    uint64_t r;
    double alpha;
    bool rslora;
    const json_t *rank_pattern, *alpha_pattern; /* objects or NULL */
    const char *base_model;                     /* base_model_name_or_path or NULL */
} peft_config;

static char *read_small_file(const char *path, size_t max, size_t *len, corral_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s: cannot open: %s",
                         path, strerror(e));
        return NULL;
    }
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, fp) : 0;
    bool bad = ferror(fp) != 0;
    fclose(fp);
    if (!buf || bad || n > max) {
        free(buf);
        corral_error_set(err,
                         !buf  ? CORRAL_OUT_OF_MEMORY
                         : bad ? CORRAL_IO
                               : CORRAL_FORMAT,
                         "%s: %s", path,
                         !buf  ? "out of memory"
                         : bad ? "read error"
                               : "file too large for an adapter config");
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* A config field that must be absent, null, false, empty, or equal to `ok_string`. */
static bool field_is_off(const json_t *v, const char *ok_string) {
    switch (json_typeof(v)) {
        case JSON_NULL:
        case JSON_FALSE:
            return true;
        case JSON_ARRAY:
            return json_array_size(v) == 0;
        case JSON_OBJECT:
            return json_object_size(v) == 0;
        case JSON_STRING: {
            const char *s = json_string_value(v);
            return ok_string ? strcmp(s, ok_string) == 0 : s[0] == '\0';
        }
        default:
            return false;
    }
}

/* Variants refused by name: config field, the value that is fine, and why the rest is not. */
typedef struct peft_refusal {
    const char *field;
    const char *ok_string; /* a string value that means "off", or NULL */
    const char *what;
} peft_refusal;

static const peft_refusal peft_refusals[] = {
    {"use_dora", NULL,
     "DoRA (use_dora) is not supported: its magnitude vector rescales whole columns, which is "
     "not a low-rank delta"},
    {"bias", "none", "trained biases (bias other than \"none\") are not supported"},
    {"lora_bias", NULL, "trained LoRA biases (lora_bias) are not supported"},
    {"modules_to_save", NULL,
     "modules_to_save (fully trained modules stored beside the adapter) is not supported"},
    {"fan_in_fan_out", NULL, "fan_in_fan_out (transposed Conv1D weights) is not supported"},
    {"alora_invocation_tokens", NULL,
     "activated LoRA (alora_invocation_tokens) is not supported: it cannot be merged"},
    {"use_qalora", NULL, "QALoRA (use_qalora) is not supported"},
    {"layer_replication", NULL, "layer_replication is not supported"},
    {"target_parameters", NULL, "target_parameters (LoRA on raw parameters) is not supported"},
    {"megatron_config", NULL, "Megatron-parallel LoRA (megatron_config) is not supported"},
};

static corral_status peft_config_read(const char *path, peft_config *c, corral_error *err) {
    memset(c, 0, sizeof *c);
    size_t len;
    char *text = read_small_file(path, LORA_CONFIG_MAX, &len, err);
    if (!text) return err ? err->status : CORRAL_IO;
    c->doc = adapter_json_parse(text, len, path, err);
    free(text);
    if (!c->doc) return err ? err->status : CORRAL_FORMAT;
    const json_t *root = c->doc;
    if (!json_is_object(root)) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: not a JSON object", path);
    }
    const json_t *v = json_object_get(root, "peft_type");
    if (v && !json_is_null(v)) {
        const char *type = json_string_value(v);
        if (!type)
            return corral_error_set(err, CORRAL_FORMAT, "%s: peft_type is not a string", path);
        if (strcmp(type, "LORA") != 0) {
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "%s: peft_type '%.32s' is not supported (only LORA)", path,
                                    type);
        }
    }
    for (size_t i = 0; i < sizeof peft_refusals / sizeof peft_refusals[0]; i++) {
        const peft_refusal *r = &peft_refusals[i];
        v = json_object_get(root, r->field);
        if (v && !field_is_off(v, r->ok_string)) {
            return corral_error_set(err, CORRAL_UNSUPPORTED, "%s: %s", path, r->what);
        }
    }
    v = json_object_get(root, "init_lora_weights");
    if (json_is_string(v)) {
        const char *init = json_string_value(v);
        static const char *const rewrites[] = {"pissa", "olora", "corda", "loftq"};
        for (size_t i = 0; i < 4; i++) {
            if (strncasecmp(init, rewrites[i], strlen(rewrites[i])) == 0) {
                return corral_error_set(err, CORRAL_UNSUPPORTED,
                                        "%s: init_lora_weights '%.32s' is not supported: it "
                                        "rewrites the base weights, so the adapter does not apply "
                                        "to the original base",
                                        path, init);
            }
        }
    }
    if (adapter_json_u64(json_object_get(root, "r"), &c->r) != 0 || c->r < 1 ||
        c->r > LORA_RANK_MAX) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: r must be an integer in 1..%u", path,
                                LORA_RANK_MAX);
    }
    v = json_object_get(root, "lora_alpha");
    c->alpha = 8.0; /* PEFT's default */
    if (v && adapter_json_f64(v, &c->alpha) != 0) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: lora_alpha is not a number", path);
    }
    v = json_object_get(root, "use_rslora");
    if (v && !json_is_boolean(v)) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: use_rslora is not true or false", path);
    }
    c->rslora = json_is_true(v);
    const char *fields[] = {"rank_pattern", "alpha_pattern"};
    const json_t **dst[] = {&c->rank_pattern, &c->alpha_pattern};
    for (int f = 0; f < 2; f++) {
        v = json_object_get(root, fields[f]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_object(v)) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: %s is not an object", path, fields[f]);
        }
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)v, key, value) {
            double x;
            uint64_t u;
            bool ok = f == 0 ? adapter_json_u64(value, &u) == 0 && u >= 1 && u <= LORA_RANK_MAX
                             : adapter_json_f64(value, &x) == 0;
            if (!ok) {
                return corral_error_set(err, CORRAL_FORMAT, "%s: %s['%.96s'] is not %s", path,
                                        fields[f], key,
                                        f == 0 ? "a rank (an integer >= 1)" : "a number");
            }
            corral_status st = pattern_check(path, fields[f], key, err);
            if (st != CORRAL_OK) return st;
        }
        *dst[f] = v;
    }
    v = json_object_get(root, "target_modules");
    if (v && !json_is_null(v) && !json_is_string(v) && !json_is_array(v)) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: target_modules is neither a list nor a string", path);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        if (!json_is_string(json_array_get(v, i))) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: target_modules[%zu] is not a string",
                                    path, i);
        }
    }
    c->base_model = json_string_value(json_object_get(root, "base_model_name_or_path"));
    return CORRAL_OK;
}

/* The GGUF architecture a Hugging Face model_type converts to. */
static const char *hf_model_type_arch(const char *model_type) {
    static const struct {
        const char *model_type, *arch;
    } table[] = {{"llama", "llama"}, {"mistral", "llama"}, {"qwen2", "qwen2"},
                 {"qwen3", "qwen3"}, {"gemma3", "gemma3"}, {"gemma3_text", "gemma3"},
                 {"phi3", "phi3"}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(model_type, table[i].model_type) == 0) return table[i].arch;
    }
    return NULL;
}

/* When the config names a base whose Hugging Face config.json can be found (beside the adapter
 * directory or inside it), its model_type must convert to the GGUF base's architecture. */
static corral_status peft_check_base_config(const char *adapter, const char *dir,
                                            const peft_config *c, const base_info *base,
                                            corral_error *err) {
    if (!c->base_model || !c->base_model[0] || strstr(c->base_model, "..")) return CORRAL_OK;
    char candidates[2][LORA_PATH_MAX];
    int n = 0, w[2] = {0, 0};
    if (c->base_model[0] == '/') {
        w[n++] = snprintf(candidates[0], LORA_PATH_MAX, "%s/config.json", c->base_model);
    } else {
        w[n++] = snprintf(candidates[0], LORA_PATH_MAX, "%s/../%s/config.json", dir, c->base_model);
        w[n++] = snprintf(candidates[1], LORA_PATH_MAX, "%s/%s/config.json", dir, c->base_model);
    }
    for (int i = 0; i < n; i++) {
        if (w[i] < 0 || w[i] >= LORA_PATH_MAX) continue; /* too long to be there */
        struct stat sb;
        if (stat(candidates[i], &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t len;
        corral_error e2;
        char *text = read_small_file(candidates[i], LORA_CONFIG_MAX, &len, &e2);
        if (!text) return CORRAL_OK; /* unreadable: the check is a courtesy, not a requirement */
        json_t *doc = adapter_json_parse(text, len, candidates[i], &e2);
        free(text);
        const char *mt = json_string_value(json_object_get(doc, "model_type"));
        corral_status st = CORRAL_OK;
        if (mt) {
            const char *arch = hf_model_type_arch(mt);
            if (!arch || strcmp(arch, base->arch) != 0) {
                st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                      "adapter %s: wrong architecture: its base %s is a '%.32s' "
                                      "model but the base model %s is '%s'",
                                      adapter, candidates[i], mt, base->path, base->arch);
            }
        }
        json_decref(doc);
        return st;
    }
    return CORRAL_OK;
}

/* ---- PEFT: tensor names -------------------------------------------------------------------------
 */

#define PEFT_PREFIX "base_model.model."

typedef enum peft_role { PEFT_Q, PEFT_K, PEFT_OTHER } peft_role;

/* Maps a PEFT module name to its GGUF tensor; 0 on success, -1 for an unknown module. */
static int peft_module_to_gguf(const char *module, char *out, size_t cap, bool *embedding,
                               peft_role *role) {
    static const struct {
        const char *hf, *gguf;
        peft_role role;
    } layer_map[] = {
        {"self_attn.q_proj", "attn_q", PEFT_Q},
        {"self_attn.k_proj", "attn_k", PEFT_K},
        {"self_attn.v_proj", "attn_v", PEFT_OTHER},
        {"self_attn.o_proj", "attn_output", PEFT_OTHER},
        {"mlp.gate_proj", "ffn_gate", PEFT_OTHER},
        {"mlp.up_proj", "ffn_up", PEFT_OTHER},
        {"mlp.down_proj", "ffn_down", PEFT_OTHER},
        /* phi3's fused projections: GGUF keeps them fused, in the same row order */
        {"self_attn.qkv_proj", "attn_qkv", PEFT_OTHER},
        {"mlp.gate_up_proj", "ffn_up", PEFT_OTHER},
    };
    *embedding = false;
    *role = PEFT_OTHER;
    if (strcmp(module, "model.embed_tokens") == 0) {
        snprintf(out, cap, "token_embd.weight");
        *embedding = true;
        return 0;
    }
    if (strcmp(module, "lm_head") == 0) {
        snprintf(out, cap, "output.weight");
        return 0;
    }
    const char *p = "model.layers.";
    size_t pl = strlen(p);
    if (strncmp(module, p, pl) != 0 || !isdigit((unsigned char)module[pl])) return -1;
    char *end;
    errno = 0;
    unsigned long layer = strtoul(module + pl, &end, 10);
    if (errno || *end != '.' || layer > 100000 || (module[pl] == '0' && end != module + pl + 1)) {
        return -1;
    }
    for (size_t i = 0; i < sizeof layer_map / sizeof layer_map[0]; i++) {
        if (strcmp(end + 1, layer_map[i].hf) == 0) {
            snprintf(out, cap, "blk.%lu.%s.weight", layer, layer_map[i].gguf);
            *role = layer_map[i].role;
            return 0;
        }
    }
    return -1;
}

/* One module's tensors being collected. */
typedef struct peft_module {
    char *module; /* "model.layers.0.self_attn.q_proj" */
    const safetensors_tensor *a, *b;
    bool embedding_names; /* lora_embedding_A/B rather than lora_A/B.weight */
} peft_module;

static int module_cmp(const void *x, const void *y) {
    return strcmp(((const peft_module *)x)->module, ((const peft_module *)y)->module);
}

static corral_status st_matrix(const char *adapter, const safetensors_tensor *t, lora_matrix *m,
                               corral_error *err) {
    uint32_t type;
    switch (t->dtype) {
        case SAFETENSORS_F32:
            type = TENSOR_TYPE_F32;
            break;
        case SAFETENSORS_F16:
            type = TENSOR_TYPE_F16;
            break;
        case SAFETENSORS_BF16:
            type = TENSOR_TYPE_BF16;
            break;
        default:
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "adapter %s: tensor '%s' is %s; LoRA factors must be F32, F16 "
                                    "or BF16",
                                    adapter, t->name, safetensors_dtype_name(t->dtype));
    }
    if (t->n_dims != 2) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "adapter %s: tensor '%s' has %" PRIu32
                                " dimensions, LoRA factors have 2",
                                adapter, t->name, t->n_dims);
    }
    m->data = t->data;
    m->type = type;
    m->rows = t->shape[0];
    m->cols = t->shape[1];
    m->row_bytes = (size_t)m->cols * safetensors_dtype_size(t->dtype);
    return CORRAL_OK;
}

/* Splits "base_model.model.<module>.<suffix>" for the four LoRA suffixes. Returns 1 for A, 2 for
 * B, 0 when the name is no LoRA factor; *embedding tells the embedding spelling. */
static int peft_split(const char *name, char **module, bool *embedding) {
    static const struct {
        const char *suffix;
        int which;
        bool embedding;
    } suffixes[] = {{".lora_A.weight", 1, false},
                    {".lora_B.weight", 2, false},
                    {".lora_embedding_A", 1, true},
                    {".lora_embedding_B", 2, true}};
    size_t len = strlen(name), pl = strlen(PEFT_PREFIX);
    if (strncmp(name, PEFT_PREFIX, pl) != 0) return 0;
    for (size_t i = 0; i < 4; i++) {
        size_t sl = strlen(suffixes[i].suffix);
        if (len > pl + sl && strcmp(name + len - sl, suffixes[i].suffix) == 0) {
            *module = strndup(name + pl, len - pl - sl);
            *embedding = suffixes[i].embedding;
            return *module ? suffixes[i].which : -1;
        }
    }
    return 0;
}

static corral_status open_peft(lora_adapter *ad, const char *config_path, const char *st_path,
                               const char *dir, const base_info *base, corral_error *err) {
    const char *path = ad->path;
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};
    bool known = false;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        known = known || strcmp(base->arch, archs[i]) == 0;
    if (!known) {
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "adapter %s: PEFT adapters are mapped onto llama, qwen2, qwen3, "
                                "gemma3 and phi3 models; the base model %s is '%s'",
                                path, base->path, base->arch);
    }
    peft_config cfg;
    corral_status st = peft_config_read(config_path, &cfg, err);
    if (st == CORRAL_OK) st = peft_check_base_config(path, dir, &cfg, base, err);
    if (st == CORRAL_OK) {
        ad->st = safetensors_open(st_path, err);
        if (!ad->st) st = err ? err->status : CORRAL_FORMAT;
    }
    uint64_t n = st == CORRAL_OK ? safetensors_tensor_count(ad->st) : 0;
    peft_module *mods = st == CORRAL_OK ? calloc(n ? n : 1, sizeof *mods) : NULL;
    if (st == CORRAL_OK && !mods) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
    }
    uint64_t n_mods = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n; i++) {
        const safetensors_tensor *t = safetensors_tensor_at(ad->st, i);
        char *module = NULL;
        bool embedding = false;
        int which = peft_split(t->name, &module, &embedding);
        if (which < 0) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
            break;
        }
        if (which == 0) {
            size_t len = strlen(t->name);
            if (ends_with(t->name, len, "lora_magnitude_vector") ||
                ends_with(t->name, len, "lora_magnitude_vector.weight")) {
                st = corral_error_set(err, CORRAL_UNSUPPORTED,
                                      "adapter %s: tensor '%s': DoRA magnitude vectors are not "
                                      "supported",
                                      path, t->name);
            } else if (ends_with(t->name, len, ".bias")) {
                st = corral_error_set(err, CORRAL_UNSUPPORTED,
                                      "adapter %s: tensor '%s': trained biases are not supported",
                                      path, t->name);
            } else {
                st = corral_error_set(err, CORRAL_FORMAT,
                                      "adapter %s: tensor '%s' is not a LoRA factor (names end in "
                                      ".lora_A.weight, .lora_B.weight, .lora_embedding_A or "
                                      ".lora_embedding_B after '" PEFT_PREFIX "<module>')",
                                      path, t->name);
            }
            break;
        }
        mods[n_mods].module = module;
        mods[n_mods].embedding_names = embedding;
        if (which == 1) {
            mods[n_mods].a = t;
        } else {
            mods[n_mods].b = t;
        }
        n_mods++;
    }
    if (st == CORRAL_OK) qsort(mods, n_mods, sizeof *mods, module_cmp);
    /* Merge the A and B halves of each module (adjacent after sorting). */
    uint64_t n_pairs = 0;
    for (uint64_t i = 0; st == CORRAL_OK && i < n_mods; i++) {
        peft_module m = mods[i];
        mods[i].module = NULL;
        if (i + 1 < n_mods && strcmp(mods[i + 1].module, m.module) == 0) {
            if (mods[i + 1].embedding_names != m.embedding_names) {
                st = corral_error_set(err, CORRAL_FORMAT,
                                      "adapter %s: module '%s' mixes lora_A/B and "
                                      "lora_embedding_A/B tensors",
                                      path, m.module);
                free(m.module);
                break;
            }
            if (!m.a) m.a = mods[i + 1].a;
            if (!m.b) m.b = mods[i + 1].b;
            free(mods[i + 1].module);
            mods[i + 1].module = NULL;
            i++;
        }
        mods[n_pairs++] = m;
    }
    if (st == CORRAL_OK && n_pairs == 0) {
        st = corral_error_set(err, CORRAL_FORMAT, "adapter %s: no LoRA tensors in %s", path,
                              st_path);
    }
    if (st == CORRAL_OK) {
        ad->targets = calloc(n_pairs, sizeof *ad->targets);
        if (!ad->targets) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
        }
    }
    for (uint64_t i = 0; st == CORRAL_OK && i < n_pairs; i++) {
        const peft_module *m = &mods[i];
        const char *ka = m->embedding_names ? "lora_embedding_A" : "lora_A.weight";
        const char *kb = m->embedding_names ? "lora_embedding_B" : "lora_B.weight";
        char what_a[320], what_b[320];
        snprintf(what_a, sizeof what_a, PEFT_PREFIX "%s.%s", m->module, ka);
        snprintf(what_b, sizeof what_b, PEFT_PREFIX "%s.%s", m->module, kb);
        char gguf_name[128];
        bool embedding;
        peft_role role;
        if (peft_module_to_gguf(m->module, gguf_name, sizeof gguf_name, &embedding, &role) != 0) {
            st = corral_error_set(err, CORRAL_UNSUPPORTED,
                                  "adapter %s: unknown PEFT module '%s' (tensor '%s'); corral maps "
                                  "model.layers.N.self_attn.{q,k,v,o}_proj, "
                                  "model.layers.N.mlp.{gate,up,down}_proj, model.embed_tokens and "
                                  "lm_head",
                                  path, m->module, m->a ? m->a->name : m->b->name);
            break;
        }
        if (!m->a || !m->b) {
            st = corral_error_set(err, CORRAL_FORMAT, "adapter %s: module '%s': missing %s", path,
                                  m->module, m->a ? what_b : what_a);
            break;
        }
        if (embedding != m->embedding_names) {
            st = corral_error_set(err, CORRAL_FORMAT, "adapter %s: module '%s' must use %s tensors",
                                  path, m->module,
                                  embedding ? "lora_embedding_A/B" : "lora_A/B.weight");
            break;
        }
        lora_target *t = &ad->targets[ad->n_targets];
        t->name = strdup(gguf_name);
        if (!t->name) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
            break;
        }
        ad->n_targets++;
        t->layout = embedding ? LORA_LAYOUT_PEFT_EMBD : LORA_LAYOUT_LINEAR;
        const gguf_tensor *w = NULL;
        st = st_matrix(path, m->a, &t->a, err);
        if (st == CORRAL_OK) st = st_matrix(path, m->b, &t->b, err);
        if (st == CORRAL_OK) st = check_base_tensor(path, base, t->name, &w, err);
        if (st == CORRAL_OK) st = check_target(path, t, w, what_a, what_b, err);
        if (st != CORRAL_OK) break;

        double r = (double)cfg.r, alpha = cfg.alpha, x;
        int found;
        st = pattern_lookup(config_path, "rank_pattern", cfg.rank_pattern, m->module, &x, &found,
                            err);
        if (st != CORRAL_OK) break;
        if (found) r = x;
        st = pattern_lookup(config_path, "alpha_pattern", cfg.alpha_pattern, m->module, &x, &found,
                            err);
        if (st != CORRAL_OK) break;
        if (found) alpha = x;
        if (r != (double)t->rank) {
            st = corral_error_set(err, CORRAL_FORMAT,
                                  "adapter %s: module '%s': rank mismatch: the config gives rank "
                                  "%.0f but its tensors have rank %" PRIu32,
                                  path, m->module, r, t->rank);
            break;
        }
        t->alpha = (float)alpha;
        t->scaling = (float)(cfg.rslora ? alpha / sqrt(r) : alpha / r);
        if (!embedding && strcmp(base->arch, "llama") == 0 && role != PEFT_OTHER) {
            uint32_t groups = role == PEFT_Q ? base->n_head : base->n_head_kv;
            if (groups == 0 || t->n_out % groups != 0 || (t->n_out / groups) % 2 != 0) {
                st = corral_error_set(err, CORRAL_FORMAT,
                                      "adapter %s: module '%s': %" PRId64
                                      " rows cannot be split into %" PRIu32
                                      " heads of even size for the Q/K permutation",
                                      path, m->module, t->n_out, groups);
                break;
            }
            t->permute_groups = groups;
        }
    }
    for (uint64_t i = 0; mods && i < n_mods; i++) free(mods[i].module);
    free(mods);
    json_decref(cfg.doc);
    return st;
}

/* ---- opening -----------------------------------------------------------------------------------
 */

static bool has_suffix(const char *s, const char *suffix) {
    return ends_with(s, strlen(s), suffix);
}

int lora__adapter_files(const char *path, char files[2][LORA_PATH_MAX], lora_format *format,
                        corral_error *err) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) {
        int e = path ? errno : EINVAL;
        corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "adapter %s: %s",
                         path ? path : "(null)", strerror(e));
        return -1;
    }
    char dir[LORA_PATH_MAX];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else if (S_ISREG(sb.st_mode) &&
               (has_suffix(path, ".json") || has_suffix(path, ".safetensors"))) {
        const char *slash = strrchr(path, '/');
        if (slash) {
            snprintf(dir, sizeof dir, "%.*s", (int)(slash == path ? 1 : slash - path), path);
        } else {
            snprintf(dir, sizeof dir, ".");
        }
    } else if (S_ISREG(sb.st_mode)) {
        *format = LORA_FORMAT_GGUF;
        snprintf(files[0], LORA_PATH_MAX, "%s", path);
        return 1;
    } else {
        corral_error_set(err, CORRAL_IO, "adapter %s: neither a file nor a directory", path);
        return -1;
    }
    *format = LORA_FORMAT_PEFT;
    int n1 = snprintf(files[0], LORA_PATH_MAX, "%s/adapter_config.json", dir);
    int n2 = snprintf(files[1], LORA_PATH_MAX, "%s/adapter_model.safetensors", dir);
    if (n1 < 0 || n1 >= LORA_PATH_MAX || n2 < 0 || n2 >= LORA_PATH_MAX) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "adapter %s: path too long", path);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        if (stat(files[i], &sb) != 0 || !S_ISREG(sb.st_mode)) {
            corral_error_set(err, CORRAL_NOT_FOUND,
                             "adapter %s: a PEFT adapter needs %s (not a GGUF file either)", path,
                             files[i]);
            return -1;
        }
    }
    return 2;
}

int lora_adapter_files(const char *path, char files[2][LORA_PATH_MAX], corral_error *err) {
    lora_format format;
    return lora__adapter_files(path, files, &format, err);
}

lora_adapter *lora_adapter_open(const char *path, const gguf_file *base, corral_error *err) {
    if (!path || !base) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "lora_adapter_open: NULL argument");
        return NULL;
    }
    base_info bi;
    if (base_info_read(base, &bi, err) != CORRAL_OK) return NULL;
    char files[2][LORA_PATH_MAX];
    lora_format format;
    if (lora__adapter_files(path, files, &format, err) < 0) return NULL;
    lora_adapter *ad = calloc(1, sizeof *ad);
    if (ad) ad->path = strdup(path);
    if (!ad || !ad->path) {
        free(ad);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "adapter %s: out of memory", path);
        return NULL;
    }
    ad->format = format;
    corral_status st;
    if (format == LORA_FORMAT_GGUF) {
        st = open_gguf(ad, &bi, err);
    } else {
        char dir[LORA_PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)(strlen(files[0]) - strlen("/adapter_config.json")),
                 files[0]);
        st = open_peft(ad, files[0], files[1], dir, &bi, err);
    }
    if (st != CORRAL_OK) {
        lora_adapter_destroy(&ad);
        return NULL;
    }
    qsort(ad->targets, ad->n_targets, sizeof *ad->targets, target_cmp);
    for (uint32_t i = 1; i < ad->n_targets; i++) {
        if (strcmp(ad->targets[i - 1].name, ad->targets[i].name) == 0) {
            corral_error_set(err, CORRAL_FORMAT, "adapter %s: tensor '%s' is targeted twice", path,
                             ad->targets[i].name);
            lora_adapter_destroy(&ad);
            return NULL;
        }
    }
    return ad;
}
