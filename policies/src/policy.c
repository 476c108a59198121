/*
 * policy.c — the host side of the policy ABI (see policy.h): plugin loading, the per-model
 * services, profiles, the sanitizer driver and the per-generation processor.
 *
 * The built-in output constraint is a policy here too (`regex`): its instance holds a pattern,
 * its gen_begin fetches the compiled constraint from the model's cache and starts a matcher. A
 * request's own regex is run through the same table, with a temporary instance.
 *
 * A generation's processor combines every active generation hook: allowed = all allow, mask =
 * every mask, accept = every accept (the first error wins), finished = the first negative
 * answer, else any positive one.
 */
#include "corral/policy.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/log.h"
#include "regex.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

_Static_assert(CORRAL_POLICY_OK == CORRAL_OK, "policy ABI status values");
_Static_assert(CORRAL_POLICY_INVALID_ARGUMENT == CORRAL_INVALID_ARGUMENT, "policy ABI status");
_Static_assert(CORRAL_POLICY_OUT_OF_MEMORY == CORRAL_OUT_OF_MEMORY, "policy ABI status values");
_Static_assert(CORRAL_POLICY_REJECTED == CORRAL_SANITIZER_REJECTED, "policy ABI status values");
_Static_assert(CORRAL_POLICY_INTERNAL == CORRAL_INTERNAL, "policy ABI status values");
_Static_assert(CORRAL_POLICY_TOO_LARGE == CORRAL_RESOURCE_EXHAUSTED, "policy ABI status values");

/* The size of version 1's table: a plugin must provide at least this much. */
#define POLICY_V1_SIZE (offsetof(corral_policy_v1, gen_end) + sizeof(void (*)(void *)))

/* A callback's status as a corral_status (anything unknown becomes INTERNAL). */
static corral_status as_status(int rc) {
    return rc < 0 && corral_status_name(rc) ? (corral_status)rc : CORRAL_INTERNAL;
}

/* ---- the built-in output constraint ---------------------------------------------------------- */

typedef struct regex_policy {
    char *pattern;
    size_t len;
} regex_policy;

typedef struct regex_gen {
    constraint *c;
    constraint_matcher *m;
} regex_gen;

static int regex_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                      size_t cap) {
    const char *pattern = NULL;
    for (size_t i = 0; i < n; i++) {
        if (kv[i].key && strcmp(kv[i].key, "pattern") == 0) {
            pattern = kv[i].value;
        } else {
            snprintf(msg, cap, "regex: unknown setting '%s' (known: pattern)",
                     kv[i].key ? kv[i].key : "(null)");
            return CORRAL_POLICY_INVALID_ARGUMENT;
        }
    }
    if (!pattern) {
        snprintf(msg, cap, "regex: pattern is required");
        return CORRAL_POLICY_INVALID_ARGUMENT;
    }
    /* Check the pattern now, so that a bad one stops startup rather than every request; the
     * token masks are built per model when a generation needs them. */
    regex_dfa dfa;
    corral_error err;
    if (regex__compile(pattern, strlen(pattern), 0, &dfa, NULL, &err) != CORRAL_OK) {
        snprintf(msg, cap, "%s", err.message);
        return (int)err.status;
    }
    regex__free(&dfa);
    regex_policy *r = calloc(1, sizeof *r);
    if (r) r->pattern = strdup(pattern);
    if (!r || !r->pattern) {
        free(r);
        snprintf(msg, cap, "out of memory");
        return CORRAL_POLICY_OUT_OF_MEMORY;
    }
    r->len = strlen(pattern);
    *instance = r;
    return 0;
}

static void regex_destroy(void *instance) {
    regex_policy *r = instance;
    if (r) free(r->pattern);
    free(r);
}

static int regex_gen_begin(void *instance, const corral_policy_host *host, void **gen);

static void regex_gen_end(void *gen) {
    regex_gen *g = gen;
    if (!g) return;
    constraint_matcher_destroy(&g->m);
    constraint_destroy(&g->c);
    free(g);
}

static int regex_gen_allowed(void *gen, int32_t token) {
    return constraint_matcher_allowed(((regex_gen *)gen)->m, token);
}

static void regex_gen_mask(void *gen, float *logits, int32_t n_vocab) {
    constraint_matcher_mask(((regex_gen *)gen)->m, logits, n_vocab);
}

static int regex_gen_accept(void *gen, int32_t token) {
    return constraint_matcher_accept(((regex_gen *)gen)->m, token);
}

static int regex_gen_finished(void *gen) {
    return constraint_matcher_finished(((regex_gen *)gen)->m);
}

static const corral_policy_v1 builtin_regex = {
    .abi_version = CORRAL_POLICY_ABI_VERSION,
    .struct_size = sizeof(corral_policy_v1),
    .name = "regex",
    .description = "the whole output must match a regular expression",
    .init = regex_init,
    .destroy = regex_destroy,
    .gen_begin = regex_gen_begin,
    .gen_allowed = regex_gen_allowed,
    .gen_mask = regex_gen_mask,
    .gen_accept = regex_gen_accept,
    .gen_finished = regex_gen_finished,
    .gen_end = regex_gen_end,
};

const corral_policy_v1 *policy_builtin_find(const char *name) {
    if (name && strcmp(name, "regex") == 0) return &builtin_regex;
    return sanitize_builtin(name);
}

const char *policy_builtin_names(void) {
    return "utf8, invisible, special_tokens, max_input, deny, normalize_space, regex";
}

/* ---- plugins ------------------------------------------------------------------------------------
 */

struct policy_plugin {
    void *handle;
    const corral_policy_v1 *table;
    char *path;
};

/* The table's shape: what a host may rely on before calling anything. */
static corral_status check_table(const corral_policy_v1 *t, const char *path, corral_error *err) {
    if (t->abi_version != CORRAL_POLICY_ABI_VERSION)
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "plugin %s: built for policy ABI version %u; this corral supports "
                                "version %u",
                                path, t->abi_version, CORRAL_POLICY_ABI_VERSION);
    if (t->struct_size < POLICY_V1_SIZE)
        return corral_error_set(err, CORRAL_FORMAT,
                                "plugin %s: its table is %u bytes; version 1 needs %zu", path,
                                t->struct_size, (size_t)POLICY_V1_SIZE);
    if (!t->name || !t->name[0] || strlen(t->name) >= 32)
        return corral_error_set(err, CORRAL_FORMAT, "plugin %s: no name (or over 31 bytes)", path);
    if (!t->init)
        return corral_error_set(err, CORRAL_FORMAT, "plugin %s (%s): no init callback", path,
                                t->name);
    const bool any_gen =
        t->gen_allowed || t->gen_mask || t->gen_accept || t->gen_finished || t->gen_end;
    if (any_gen && !t->gen_begin)
        return corral_error_set(err, CORRAL_FORMAT,
                                "plugin %s (%s): generation hooks without gen_begin", path,
                                t->name);
    if (!t->gen_allowed != !t->gen_mask)
        return corral_error_set(err, CORRAL_FORMAT,
                                "plugin %s (%s): gen_allowed and gen_mask must come together", path,
                                t->name);
    if (!t->sanitize && !t->gen_begin)
        return corral_error_set(err, CORRAL_FORMAT,
                                "plugin %s (%s): neither sanitize nor generation hooks", path,
                                t->name);
    return CORRAL_OK;
}

policy_plugin *policy_plugin_load(const char *path, corral_error *err) {
    if (!path || !*path) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "plugin: no path");
        return NULL;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        corral_error_set(err, CORRAL_IO, "plugin %s: cannot load: %s", path, why ? why : "?");
        return NULL;
    }
    dlerror();
    void *sym = dlsym(h, CORRAL_POLICY_ENTRY_SYMBOL);
    const char *why = dlerror();
    if (!sym || why) {
        corral_error_set(err, CORRAL_NOT_FOUND, "plugin %s: no %s symbol: %s", path,
                         CORRAL_POLICY_ENTRY_SYMBOL, why ? why : "NULL");
        dlclose(h);
        return NULL;
    }
    corral_policy_v1_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer, as POSIX allows */
    const corral_policy_v1 *t = entry();
    if (!t) {
        corral_error_set(err, CORRAL_FORMAT, "plugin %s: %s returned NULL", path,
                         CORRAL_POLICY_ENTRY_SYMBOL);
        dlclose(h);
        return NULL;
    }
    if (check_table(t, path, err) != CORRAL_OK) {
        dlclose(h);
        return NULL;
    }
    policy_plugin *p = calloc(1, sizeof *p);
    if (p) p->path = strdup(path);
    if (!p || !p->path) {
        free(p);
        dlclose(h);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "plugin %s: out of memory", path);
        return NULL;
    }
    p->handle = h;
    p->table = t;
    log_info("policy plugin loaded", LOG_STR("path", path), LOG_STR("name", t->name));
    return p;
}

const corral_policy_v1 *policy_plugin_table(const policy_plugin *p) {
    return p ? p->table : NULL;
}

void policy_plugin_destroy(policy_plugin **pp) {
    if (!pp || !*pp) return;
    policy_plugin *p = *pp;
    dlclose(p->handle);
    free(p->path);
    free(p);
    *pp = NULL;
}

/* ---- per-model services ------------------------------------------------------------------------
 */

struct policy_vocab {
    const tokenizer *tok;
    corral_policy_host host;
    constraint_cache *constraints;
    char **specials; /* NUL-terminated texts */
    size_t *special_len;
    size_t n_specials;
    /* specials by first byte, longest first: by_byte[b] .. by_byte[b + 1] in `order` */
    uint32_t by_byte[257];
    uint32_t *order;
    uint32_t *tok_off; /* [n_vocab + 1]: the bytes each token adds to the output, in tok_bytes */
    char *tok_bytes;
};

static int64_t host_count_tokens(void *ctx, const char *text, size_t len) {
    const policy_vocab *v = ctx;
    size_t n = 0;
    const corral_status st = tok_encode(v->tok, text, len, 0, NULL, 0, &n, NULL);
    if (st != CORRAL_OK && st != CORRAL_RESOURCE_EXHAUSTED) return st;
    return (int64_t)n;
}

static int host_token_bytes(void *ctx, int32_t id, const char **bytes, size_t *len) {
    const policy_vocab *v = ctx;
    if (id < 0 || id >= tok_vocab_size(v->tok)) return CORRAL_POLICY_INVALID_ARGUMENT;
    *bytes = v->tok_bytes + v->tok_off[id];
    *len = v->tok_off[id + 1] - v->tok_off[id];
    return 0;
}

/* The bytes of every token as the generator emits them (tok_decode_piece without flags). */
static bool vocab_fill_bytes(policy_vocab *v) {
    const int32_t n_vocab = tok_vocab_size(v->tok);
    const size_t cap = tok_max_piece_len(v->tok) + 16;
    char *piece = malloc(cap);
    v->tok_off = calloc((size_t)n_vocab + 1, sizeof *v->tok_off);
    size_t used = 0, bytes_cap = 1024;
    v->tok_bytes = malloc(bytes_cap);
    bool ok = piece && v->tok_off && v->tok_bytes;
    for (int32_t id = 0; ok && id < n_vocab; id++) {
        v->tok_off[id] = (uint32_t)used;
        size_t n = 0;
        if (tok_decode_piece(v->tok, id, 0, piece, cap, &n, NULL) != CORRAL_OK) n = 0;
        if (used + n > UINT32_MAX) ok = false;
        while (ok && used + n > bytes_cap) {
            char *b = realloc(v->tok_bytes, bytes_cap * 2);
            if (!b)
                ok = false;
            else
                v->tok_bytes = b, bytes_cap *= 2;
        }
        if (ok && n) memcpy(v->tok_bytes + used, piece, n);
        used += n;
    }
    if (ok) v->tok_off[n_vocab] = (uint32_t)used;
    free(piece);
    return ok;
}

static int host_token_kind(void *ctx, int32_t id) {
    const policy_vocab *v = ctx;
    if (id < 0 || id >= tok_vocab_size(v->tok)) return -1;
    if (tok_is_eog(v->tok, id)) return CORRAL_POLICY_TOKEN_EOG;
    switch (tok_token_type(v->tok, id)) {
        case TOK_TYPE_CONTROL:
        case TOK_TYPE_UNKNOWN:
            return CORRAL_POLICY_TOKEN_CONTROL;
        case TOK_TYPE_UNUSED:
        case TOK_TYPE_UNDEFINED:
            return CORRAL_POLICY_TOKEN_EMPTY;
        default:
            return CORRAL_POLICY_TOKEN_NORMAL;
    }
}

static size_t host_special_prefix(void *ctx, const char *text, size_t len) {
    const policy_vocab *v = ctx;
    if (len == 0) return 0;
    const uint8_t b = (uint8_t)text[0];
    for (uint32_t i = v->by_byte[b]; i < v->by_byte[b + 1]; i++) {
        const uint32_t s = v->order[i];
        if (v->special_len[s] <= len && memcmp(v->specials[s], text, v->special_len[s]) == 0)
            return v->special_len[s];
    }
    return 0;
}

/* Texts user input must not be able to smuggle: control and unknown tokens, and user-defined
 * tokens that look like markers (the tokenizer matches user-defined tokens even in user text,
 * and vocabularies such as DeepSeek's use them for <|User|>, <|EOT|>, <｜fim▁hole｜>). */
static bool is_special_text(tok_type type, const char *s, size_t n) {
    if (n == 0) return false;
    if (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN) return true;
    if (type != TOK_TYPE_USER_DEFINED || n < 3) return false;
    return (s[0] == '<' && s[n - 1] == '>') || (s[0] == '[' && s[n - 1] == ']');
}

static int special_cmp(const void *a, const void *b, void *ctx) {
    const policy_vocab *v = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const uint8_t bx = (uint8_t)v->specials[x][0], by = (uint8_t)v->specials[y][0];
    if (bx != by) return bx < by ? -1 : 1;
    if (v->special_len[x] != v->special_len[y])
        return v->special_len[x] > v->special_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

policy_vocab *policy_vocab_new(const tokenizer *t, corral_error *err) {
    if (!t) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "policy vocab: no tokenizer");
        return NULL;
    }
    policy_vocab *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    v->tok = t;
    v->constraints = constraint_cache_new(t, 0, err);
    if (!v->constraints) {
        free(v);
        return NULL;
    }
    const int32_t n_vocab = tok_vocab_size(t);
    if (!vocab_fill_bytes(v)) goto oom;
    for (int pass = 0; pass < 2; pass++) { /* count, then copy */
        size_t n = 0;
        for (int32_t id = 0; id < n_vocab; id++) {
            size_t len = 0;
            const char *s = tok_token_text(t, id, &len);
            if (!s || !is_special_text(tok_token_type(t, id), s, len)) continue;
            if (pass == 1) {
                v->specials[n] = malloc(len + 1);
                if (!v->specials[n]) goto oom;
                memcpy(v->specials[n], s, len);
                v->specials[n][len] = '\0';
                v->special_len[n] = len;
            }
            n++;
            if (pass == 1) v->n_specials = n;
        }
        if (pass == 0) {
            v->specials = calloc(n + 1, sizeof *v->specials);
            v->special_len = calloc(n + 1, sizeof *v->special_len);
            v->order = calloc(n + 1, sizeof *v->order);
            if (!v->specials || !v->special_len || !v->order) goto oom;
        }
    }
    for (uint32_t i = 0; i < v->n_specials; i++) v->order[i] = i;
    qsort_r(v->order, v->n_specials, sizeof *v->order, special_cmp, v);
    for (uint32_t i = 0; i < v->n_specials; i++)
        v->by_byte[(uint8_t)v->specials[v->order[i]][0] + 1]++;
    for (int b = 0; b < 256; b++) v->by_byte[b + 1] += v->by_byte[b];
    v->host = (corral_policy_host){
        .struct_size = sizeof(corral_policy_host),
        .ctx = v,
        .n_vocab = n_vocab,
        .count_tokens = host_count_tokens,
        .token_bytes = host_token_bytes,
        .token_kind = host_token_kind,
        .special_prefix = host_special_prefix,
    };
    return v;
oom:
    policy_vocab_destroy(&v);
    corral_error_set(err, CORRAL_OUT_OF_MEMORY, "policy vocab: out of memory");
    return NULL;
}

void policy_vocab_destroy(policy_vocab **pv) {
    if (!pv || !*pv) return;
    policy_vocab *v = *pv;
    for (size_t i = 0; v->specials && i < v->n_specials; i++) free(v->specials[i]);
    free(v->specials);
    free(v->special_len);
    free(v->order);
    free(v->tok_off);
    free(v->tok_bytes);
    constraint_cache_destroy(&v->constraints);
    free(v);
    *pv = NULL;
}

const corral_policy_host *policy_vocab_host(const policy_vocab *v) {
    return v ? &v->host : NULL;
}

constraint_cache *policy_vocab_constraints(policy_vocab *v) {
    return v ? v->constraints : NULL;
}

const char *const *policy_vocab_specials(const policy_vocab *v, size_t *n) {
    if (n) *n = v ? v->n_specials : 0;
    return v ? (const char *const *)v->specials : NULL;
}

/* Start a matcher for pattern under v's cache. */
static corral_status regex_gen_start(policy_vocab *v, constraint_syntax syntax, const char *pattern,
                                     size_t len, regex_gen **out, corral_error *err) {
    regex_gen *g = calloc(1, sizeof *g);
    if (!g) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint: out of memory");
    g->c = constraint_compile_cached_as(v->constraints, syntax, pattern, len, err);
    g->m = g->c ? constraint_matcher_new(g->c, err) : NULL;
    if (!g->m) {
        regex_gen_end(g);
        return err ? err->status : CORRAL_INVALID_ARGUMENT;
    }
    *out = g;
    return CORRAL_OK;
}

static int regex_gen_begin(void *instance, const corral_policy_host *host, void **gen) {
    const regex_policy *r = instance;
    /* The built-in needs the model's constraint cache, which only corral's own host has. */
    if (!host || host->count_tokens != host_count_tokens) return CORRAL_POLICY_INTERNAL;
    corral_error err;
    return regex_gen_start(host->ctx, CONSTRAINT_REGEX, r->pattern, r->len, (regex_gen **)gen,
                           &err);
}

/* ---- profiles ----------------------------------------------------------------------------------
 */

typedef struct policy_step {
    const corral_policy_v1 *table;
    void *instance;
    policy_plugin *plugin; /* owned; NULL for built-ins */
    char name[32];
} policy_step;

struct policy_profile {
    char *name;
    size_t n_steps;
    policy_step steps[];
};

/* Make one step: find or load its table, then init. */
static corral_status step_make(policy_step *s, const char *profile, size_t index,
                               const policy_step_desc *d, corral_error *err) {
    const char *kind = d->kind ? d->kind : "";
    if (strcmp(kind, "plugin") == 0) {
        if (!d->path || !*d->path)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "profile '%s', step %zu (plugin): no path", profile, index + 1);
        s->plugin = policy_plugin_load(d->path, err);
        if (!s->plugin)
            return corral_error_prefix(err, "profile '%s', step %zu", profile, index + 1);
        s->table = s->plugin->table;
    } else {
        s->table = policy_builtin_find(kind);
        if (!s->table)
            return corral_error_set(err, CORRAL_NOT_FOUND,
                                    "profile '%s', step %zu: unknown policy '%s' (built-ins: %s; "
                                    "or plugin with a path)",
                                    profile, index + 1, kind, policy_builtin_names());
    }
    snprintf(s->name, sizeof s->name, "%s", s->table->name);
    char msg[CORRAL_ERROR_MESSAGE_MAX] = "";
    const int rc =
        s->table->init(d->params, d->params ? d->n_params : 0, &s->instance, msg, sizeof msg);
    if (rc != 0)
        return corral_error_set(err, rc < 0 ? as_status(rc) : CORRAL_INTERNAL,
                                "profile '%s', step %zu (%s): %s", profile, index + 1, s->name,
                                msg[0] ? msg : "init failed");
    return CORRAL_OK;
}

static void step_free(policy_step *s) {
    if (s->table && s->table->destroy && s->instance) s->table->destroy(s->instance);
    s->instance = NULL;
    policy_plugin_destroy(&s->plugin);
}

policy_profile *policy_profile_new(const char *name, const policy_step_desc *steps, size_t n_steps,
                                   corral_error *err) {
    if (!name || (!steps && n_steps)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "profile: no name or steps");
        return NULL;
    }
    if (n_steps > POLICY_MAX_STEPS) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "profile '%s': %zu steps; at most %d", name,
                         n_steps, POLICY_MAX_STEPS);
        return NULL;
    }
    policy_profile *p = calloc(1, sizeof *p + n_steps * sizeof p->steps[0]);
    if (p) p->name = strdup(name);
    if (!p || !p->name) {
        free(p);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "profile '%s': out of memory", name);
        return NULL;
    }
    for (size_t i = 0; i < n_steps; i++) {
        p->n_steps = i + 1;
        if (step_make(&p->steps[i], name, i, &steps[i], err) != CORRAL_OK) {
            policy_profile_destroy(&p);
            return NULL;
        }
    }
    return p;
}

void policy_profile_destroy(policy_profile **pp) {
    if (!pp || !*pp) return;
    policy_profile *p = *pp;
    for (size_t i = 0; i < p->n_steps; i++) step_free(&p->steps[i]);
    free(p->name);
    free(p);
    *pp = NULL;
}

const char *policy_profile_name(const policy_profile *p) {
    return p ? p->name : NULL;
}

size_t policy_profile_n_steps(const policy_profile *p) {
    return p ? p->n_steps : 0;
}

const char *policy_profile_step_name(const policy_profile *p, size_t i) {
    return p && i < p->n_steps ? p->steps[i].name : NULL;
}

/* ---- the sanitizer driver ----------------------------------------------------------------------
 */

typedef struct out_buf {
    char *data;
    size_t len, cap, limit;
} out_buf;

static int out_write(corral_policy_out *out, const char *bytes, size_t len) {
    out_buf *b = out->host_data;
    if (len == 0) return 0;
    if (!bytes || len > b->limit - b->len) return CORRAL_POLICY_TOO_LARGE;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return CORRAL_POLICY_OUT_OF_MEMORY;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, len);
    b->len += len;
    return 0;
}

corral_status policy_sanitize(const policy_profile *p, const policy_vocab *v, const char *text,
                              size_t len, char **out, size_t *out_len, sanitize_report *report,
                              corral_error *err) {
    if (!out || !out_len || (!text && len))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "sanitize: missing argument");
    *out = NULL;
    *out_len = 0;
    if (report) memset(report, 0, sizeof *report);
    if (report) report->bytes_in = len;
    const corral_policy_host *host = v ? &v->host : NULL;
    /* cur: the text so far (the input, or a buffer); next: where a step writes. */
    out_buf cur = {0}, next = {0};
    const char *cur_data = text ? text : "";
    size_t cur_len = len;
    const size_t limit = len > (SIZE_MAX - (1u << 20)) / 8 ? SIZE_MAX : len * 8 + (1u << 20);
    corral_status st = CORRAL_OK;
    for (size_t i = 0; p && i < p->n_steps; i++) {
        const policy_step *s = &p->steps[i];
        if (!s->table->sanitize) continue;
        corral_policy_out o = {.write = out_write, .host_data = &next};
        next.len = 0;
        next.limit = limit;
        const int rc = s->table->sanitize(s->instance, host, cur_data, cur_len, &o);
        o.note[sizeof o.note - 1] = '\0';
        sanitize_step_report *line = NULL;
        if (report && report->n_steps < SANITIZE_MAX_STEPS) {
            line = &report->steps[report->n_steps++];
            snprintf(line->step, sizeof line->step, "%s", s->name);
            line->count = o.count;
            snprintf(line->note, sizeof line->note, "%s", o.note);
        }
        if (rc < 0) {
            if (line) line->verdict = SANITIZE_REJECTED;
            if (rc == CORRAL_POLICY_REJECTED) {
                st = corral_error_set(err, CORRAL_SANITIZER_REJECTED,
                                      "sanitizer '%s' rejected the input: %s", s->name,
                                      o.note[0] ? o.note : "no reason given");
            } else {
                st = corral_error_set(err, as_status(rc), "sanitizer '%s' failed: %s", s->name,
                                      o.note[0] ? o.note : corral_strerror(as_status(rc)));
            }
            goto done;
        }
        if (rc == CORRAL_POLICY_REWRITE) {
            if (line) line->verdict = SANITIZE_CHANGED;
            out_buf t = cur;
            cur = next;
            next = t;
            cur_data = cur.data ? cur.data : "";
            cur_len = cur.len;
        } else if (rc == CORRAL_POLICY_FLAG) {
            if (line) line->verdict = SANITIZE_FLAGGED;
        } else if (line) {
            line->verdict = SANITIZE_PASSED;
        }
    }
    *out = malloc(cur_len + 1);
    if (!*out) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "sanitize: out of memory");
        goto done;
    }
    if (cur_len) memcpy(*out, cur_data, cur_len);
    (*out)[cur_len] = '\0';
    *out_len = cur_len;
    if (report) report->bytes_out = cur_len;
done:
    free(cur.data);
    free(next.data);
    return st;
}

/* ---- one generation ----------------------------------------------------------------------------
 */

typedef struct gen_hook {
    const corral_policy_v1 *table;
    void *gen;
} gen_hook;

struct policy_gen {
    size_t n;
    gen_hook hooks[POLICY_MAX_STEPS + 1];
    sampler_processor proc;
    bool active;
};

static int gen_allowed_all(void *user, int32_t token) {
    const policy_gen *g = user;
    for (size_t i = 0; i < g->n; i++)
        if (g->hooks[i].table->gen_allowed &&
            !g->hooks[i].table->gen_allowed(g->hooks[i].gen, token))
            return 0;
    return 1;
}

static void gen_mask_all(void *user, float *logits, int32_t n_vocab) {
    const policy_gen *g = user;
    for (size_t i = 0; i < g->n; i++)
        if (g->hooks[i].table->gen_mask)
            g->hooks[i].table->gen_mask(g->hooks[i].gen, logits, n_vocab);
}

static corral_status gen_accept_all(void *user, int32_t token) {
    const policy_gen *g = user;
    for (size_t i = 0; i < g->n; i++) {
        if (!g->hooks[i].table->gen_accept) continue;
        const int rc = g->hooks[i].table->gen_accept(g->hooks[i].gen, token);
        if (rc != 0) return as_status(rc);
    }
    return CORRAL_OK;
}

static int gen_finished_all(void *user) {
    const policy_gen *g = user;
    int done = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!g->hooks[i].table->gen_finished) continue;
        const int rc = g->hooks[i].table->gen_finished(g->hooks[i].gen);
        if (rc < 0) return as_status(rc);
        if (rc > 0) done = 1;
    }
    return done;
}

static corral_status hook_begin(policy_gen *g, const corral_policy_v1 *t, void *instance,
                                const policy_vocab *v, const char *name, corral_error *err) {
    void *gen = NULL;
    const int rc = t->gen_begin(instance, &v->host, &gen);
    if (rc != 0)
        return corral_error_set(err, as_status(rc), "policy '%s': cannot start the generation (%s)",
                                name, corral_strerror(as_status(rc)));
    g->hooks[g->n++] = (gen_hook){.table = t, .gen = gen};
    return CORRAL_OK;
}

policy_gen *policy_gen_new(const policy_profile *p, policy_vocab *v, const char *regex,
                           size_t regex_len, corral_error *err) {
    return policy_gen_new_as(p, v, CONSTRAINT_REGEX, regex, regex_len, err);
}

policy_gen *policy_gen_new_as(const policy_profile *p, policy_vocab *v, constraint_syntax syntax,
                              const char *regex, size_t regex_len, corral_error *err) {
    if (!v) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "policy gen: no vocabulary");
        return NULL;
    }
    policy_gen *g = calloc(1, sizeof *g);
    if (!g) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "policy gen: out of memory");
        return NULL;
    }
    for (size_t i = 0; p && i < p->n_steps; i++) {
        const policy_step *s = &p->steps[i];
        if (!s->table->gen_begin) continue;
        if (hook_begin(g, s->table, s->instance, v, s->name, err) != CORRAL_OK) goto fail;
    }
    if (regex && regex_len) { /* the request's own constraint: the built-in, with its errors */
        regex_gen *rg = NULL;
        if (regex_gen_start(v, syntax, regex, regex_len, &rg, err) != CORRAL_OK) goto fail;
        g->hooks[g->n++] = (gen_hook){.table = &builtin_regex, .gen = rg};
    }
    g->active = g->n > 0;
    g->proc = (sampler_processor){.user = g,
                                  .allowed = gen_allowed_all,
                                  .mask = gen_mask_all,
                                  .accept = gen_accept_all,
                                  .finished = gen_finished_all};
    return g;
fail:
    policy_gen_destroy(&g);
    return NULL;
}

void policy_gen_destroy(policy_gen **pg) {
    if (!pg || !*pg) return;
    policy_gen *g = *pg;
    for (size_t i = 0; i < g->n; i++)
        if (g->hooks[i].table->gen_end) g->hooks[i].table->gen_end(g->hooks[i].gen);
    free(g);
    *pg = NULL;
}

const sampler_processor *policy_gen_processor(policy_gen *g) {
    return g && g->active ? &g->proc : NULL;
}
