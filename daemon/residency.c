/*
 * residency.c — the models the core serves: loading them (merging a variant's adapters first),
 * swapping their weights out and back in, unloading them, and listing what holds memory for the
 * budget (budget.c decides; this file carries the evictions out).
 *
 * A model's states (core_model_state): UNLOADED (nothing in memory), LOADING (a load or swap-in is
 * running), RESIDENT (ready), SWAPPED (its weights unmapped to make room; what is small but slow
 * to rebuild — tokenizer, runner scratch, policy vocabulary — is kept, so a swap-in only maps the
 * weights again). Each model is a memory owner (mem.h): its weights' mapping plus a jemalloc arena
 * holding its runner, its policy vocabulary and the KV caches of its requests and sessions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corral/image.h"
#include "corral/log.h"
#include "corral/prompt.h"
#include "lora.h"
#include "sched_impl.h"

/* Heap a model needs beyond its file mapping, reserved before loading it (scratch, tokenizer
 * tables): MODEL_HEAP_RESERVE plus a 64th of the file. The accounting then measures the real
 * figure, and the budget is rebalanced right after the load if the guess was short. */
#define MODEL_HEAP_RESERVE  (8ull << 20)
/* What the daemon keeps in cache.dir, under one budget (cache.limit). */
#define CACHE_FILE_PREFIXES LORA_CACHE_FILE_PREFIX "|" MODEL_REPACK_FILE_PREFIX

sched_model *residency_find(struct core *k, const char *name) {
    for (sched_model *m = k->models; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

uint64_t residency_model_bytes(const sched_model *sm) {
    return sm->owner ? mem_owner_bytes(sm->owner) : 0;
}

uint64_t residency_total_bytes(const struct core *k) {
    uint64_t total = 0;
    for (const sched_model *sm = k->models; sm; sm = sm->next) total += residency_model_bytes(sm);
    return total;
}

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

uint64_t residency_kv_bytes(const sched_model *sm, uint32_t n_ctx) {
    const model_hparams *hp = model_get_hparams(sm->m);
    return 2ull * hp->n_layer * n_ctx * hp->n_head_kv * hp->head_dim * (sm->cfg->kv_f32 ? 4 : 2);
}

kv_cache *residency_kv_new(sched_model *sm, uint32_t n_ctx, corral_error *err) {
    const unsigned scope = mem_scope_enter(sm->owner);
    kv_cache *kv = kv_cache_new(sm->m, n_ctx, sm->cfg->kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16, err);
    mem_scope_leave(scope);
    if (kv) mem_owner_add_known(sm->owner, (int64_t)kv_cache_bytes(kv));
    return kv;
}

void residency_kv_free(sched_model *sm, kv_cache **kv) {
    if (!*kv) return;
    mem_owner_add_known(sm->owner, -(int64_t)kv_cache_bytes(*kv));
    kv_cache_destroy(kv);
}

bool residency_busy(const struct core *k, const sched_model *sm) {
    /* Jobs still waiting for it to load hold nothing of it. */
    for (const sjob *sj = k->jobs; sj; sj = sj->next)
        if (sj->model == sm && sj->phase != SJOB_WAIT_MODEL) return true;
    for (const sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->busy) return true;
    return false;
}

bool residency_kept(const sched_model *sm) {
    return sm->state == CORE_MODEL_SWAPPED && sm->m != NULL;
}

/* Bytes of sm's sessions' caches in memory. */
static uint64_t sessions_bytes(const struct core *k, const sched_model *sm) {
    uint64_t n = 0;
    for (const sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->kv) n += kv_cache_bytes(ss->kv);
    return n;
}

void residency_drop(sched_model *sm) {
    batch_free(sm);
    model_runner_destroy(&sm->runner);
    policy_vocab_destroy(&sm->pv);
    model_destroy(&sm->m);
    mem_owner_destroy(&sm->owner);
}

/* Drop a model whose sessions may still hold caches in its arena: those go to disk first. */
static void drop_with_sessions(struct core *k, sched_model *sm) {
    for (sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm) session_swap_out(k, ss);
    residency_drop(sm);
}

void residency_release(struct core *k, sched_model *sm, core_model_state to) {
    const core_model_state from = sm->state;
    if (to == CORE_MODEL_SWAPPED && from == CORE_MODEL_RESIDENT) {
        /* The weights go; the sessions' caches are holders of their own and stay. */
        model_weights_release(sm->m);
        mem_owner_set_mapped(sm->owner, 0);
    } else {
        drop_with_sessions(k, sm);
    }
    if (from == CORE_MODEL_RESIDENT) {
        if (to == CORE_MODEL_SWAPPED) sm->swap_outs++;
        log_info(to == CORE_MODEL_SWAPPED ? "model swapped out" : "model unloaded",
                 LOG_STR("model", sm->name));
    }
    sm->state = to;
    sm->reload_pending = false;
}

/* ---- the budget's holders -------------------------------------------------------------------- */

/* Every holder of memory that could be evicted, with what evicting it frees. `protect` is in
 * use. Caller frees the array; *n its length. NULL when there is nothing (or no memory). */
static budget_holder *list_candidates(struct core *k, const sched_model *protect, size_t *n) {
    size_t cap = 0;
    for (sched_model *sm = k->models; sm; sm = sm->next) cap++;
    for (sched_session *ss = k->sessions; ss; ss = ss->next) cap++;
    *n = 0;
    budget_holder *h = cap ? calloc(cap, sizeof *h) : NULL;
    if (!h) return NULL;
    for (sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->kv)
            h[(*n)++] = (budget_holder){.c = {.kind = EVICT_KIND_SESSION,
                                              .last_used_ms = ss->last_used_ms,
                                              .bytes = kv_cache_bytes(ss->kv),
                                              .reload_bytes = kv_cache_bytes(ss->kv),
                                              .user = ss},
                                        .name = ss->id,
                                        .flags = ss->busy ? BUDGET_IN_USE : 0};
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        const bool in_use = sm == protect || residency_busy(k, sm);
        if (sm->state == CORE_MODEL_RESIDENT) {
            const uint64_t mapped = mem_owner_mapped_bytes(sm->owner);
            h[(*n)++] = (budget_holder){.c = {.kind = EVICT_KIND_MODEL,
                                              .last_used_ms = sm->last_used_ms,
                                              .bytes = mapped,
                                              .reload_bytes = mapped,
                                              .rebuild_us = (uint64_t)sm->merge_us,
                                              .user = sm},
                                        .name = sm->name,
                                        .flags = (sm->pinned ? BUDGET_PINNED : 0) |
                                                 (in_use ? BUDGET_IN_USE : 0)};
        } else if (residency_kept(sm)) {
            /* Its sessions' caches live in its arena: they must be out before it can go. */
            const uint64_t sessions = sessions_bytes(k, sm);
            const uint64_t bytes = residency_model_bytes(sm);
            h[(*n)++] =
                (budget_holder){.c = {.kind = EVICT_KIND_MODEL,
                                      .last_used_ms = sm->last_used_ms,
                                      .bytes = bytes > sessions ? bytes - sessions : 0,
                                      .user = sm},
                                .name = sm->name,
                                .flags = BUDGET_KEPT | (in_use || sessions ? BUDGET_IN_USE : 0)};
        }
    }
    return h;
}

/* What holds the memory, for the error of a request that cannot get room: every model with
 * bytes, with what keeps it. */
static void describe_holders(struct core *k, const budget_params *p, char *out, size_t size) {
    size_t n = 0;
    for (sched_model *sm = k->models; sm; sm = sm->next) n++;
    budget_holder *h = n ? calloc(n, sizeof *h) : NULL;
    size_t i = 0;
    for (sched_model *sm = k->models; h && sm; sm = sm->next) {
        bool running = false;
        for (const sjob *sj = k->jobs; sj && !running; sj = sj->next)
            running = sj->model == sm && sj->phase == SJOB_ACTIVE;
        h[i++] = (budget_holder){
            .c = {.kind = EVICT_KIND_MODEL, .bytes = residency_model_bytes(sm)},
            .name = sm->name,
            .flags = (sm->pinned ? BUDGET_PINNED : 0) | (running ? BUDGET_IN_USE : 0) |
                     (residency_kept(sm) ? BUDGET_KEPT : 0)};
    }
    budget_describe(p, h, i, out, size);
    free(h);
}

corral_status residency_make_room(struct core *k, uint64_t need, const sched_model *protect,
                                  bool *never, corral_error *err) {
    const cfg *c = core_cfg(k);
    const budget_params p = {.limit = c->memory_limit,
                             .high = c->high_watermark,
                             .low = c->low_watermark,
                             .policy = evict_policy_find(c->evict_policy)};
    if (never) *never = false;
    size_t n = 0;
    budget_holder *h = list_candidates(k, protect, &n);
    size_t *victims = n ? calloc(n, sizeof *victims) : NULL;
    size_t n_victims = 0;
    const budget_verdict v = budget_plan(&p, residency_total_bytes(k), need, h, victims ? n : 0,
                                         sched__unix_ms(), victims, &n_victims);
    for (size_t i = 0; i < n_victims; i++) {
        const budget_holder *victim = &h[victims[i]];
        if (victim->c.kind == EVICT_KIND_SESSION)
            session_swap_out(k, victim->c.user);
        else if (victim->flags & BUDGET_KEPT)
            residency_drop(victim->c.user);
        else
            residency_release(k, victim->c.user, CORE_MODEL_SWAPPED);
    }
    free(victims);
    free(h);
    if (v == BUDGET_NEVER) {
        if (never) *never = true;
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "%.1f MiB are needed but memory.limit is %.1f MiB",
                                need / 1048576.0, c->memory_limit / 1048576.0);
    }
    /* The plan worked from the holders' figures; the accounting has the last word. */
    if (residency_total_bytes(k) + need <= c->memory_limit) return CORRAL_OK;
    char holders[CORRAL_ERROR_MESSAGE_MAX - 96];
    describe_holders(k, &p, holders, sizeof holders);
    return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED, "no room for %.1f MiB: %s",
                            need / 1048576.0, holders);
}

/* ---- loading --------------------------------------------------------------------------------- */

/* Set sm->weights_path: the model's own file, or for a variant the merged image in cache.dir,
 * merging its adapters first when the cache has no valid image. */
static corral_status variant_prepare(struct core *k, sched_model *sm, corral_error *err) {
    const cfg_model *mc = sm->cfg;
    const char *path = mc->path;
    lora_variant v;
    if (mc->n_adapters > 0) {
        lora_source sources[LORA_MAX_ADAPTERS];
        if (mc->n_adapters > LORA_MAX_ADAPTERS)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "model '%s': more than %d adapters", sm->name,
                                    LORA_MAX_ADAPTERS);
        for (size_t i = 0; i < mc->n_adapters; i++)
            sources[i] =
                (lora_source){.path = mc->adapters[i].path, .scale = mc->adapters[i].scale};
        const lora_variant_request req = {
            .base_path = mc->path,
            .adapters = sources,
            .n_adapters = (uint32_t)mc->n_adapters,
            .cache_dir = core_cfg(k)->cache_dir,
            .cache_limit_bytes = core_cfg(k)->cache_limit,
            .pool = k->pool,
            /* Every byte is checked the first time; later swap-ins trust the verified image. */
            .verify = sm->verified ? IMAGE_VERIFY_METADATA : IMAGE_VERIFY_FULL};
        const unsigned scope = mem_scope_default();
        corral_status st = lora_variant_prepare(&req, &v, err);
        mem_scope_leave(scope);
        if (st != CORRAL_OK) return corral_error_prefix(err, "model '%s'", sm->name);
        sm->verified = true;
        if (!v.cache_hit) {
            sm->merges++;
            sm->merge_us = (int64_t)(v.merge_seconds * 1e6);
            log_info("variant merged", LOG_STR("model", sm->name), LOG_STR("base", mc->path),
                     LOG_UINT("adapters", mc->n_adapters), LOG_F64("seconds", v.merge_seconds),
                     LOG_STR("reason", image_problem_name(v.reason)), LOG_STR("image", v.path));
        }
        path = v.path;
    }
    const unsigned scope = mem_scope_default();
    char *copy = strdup(path);
    mem_scope_leave(scope);
    if (!copy) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    free(sm->weights_path);
    sm->weights_path = copy;
    return CORRAL_OK;
}

/* Keep the cache directory (merged variants and rearranged weights, one budget) under
 * cache.limit, least recently used first; `in_use` (a path in it, or NULL) stays. */
static void cache_trim(const struct core *k, const char *in_use) {
    const cfg *c = core_cfg(k);
    if (!in_use || c->cache_limit == 0) return;
    const char *slash = strrchr(in_use, '/');
    corral_error err;
    image_trim_report rep;
    if (image_dir_trim(c->cache_dir, CACHE_FILE_PREFIXES, c->cache_limit,
                       slash ? slash + 1 : in_use, &rep, &err) != CORRAL_OK)
        log_warn("cannot trim the cache directory", LOG_STR("dir", c->cache_dir),
                 LOG_STR("error", err.message));
    else if (rep.n_removed)
        log_info("cache directory trimmed", LOG_STR("dir", c->cache_dir),
                 LOG_UINT("removed", rep.n_removed),
                 LOG_F64("mib_removed", rep.bytes_removed / 1048576.0));
}

/* Load sm from scratch (its weights_path): model, runner, vocabulary, in an arena of its own. On
 * success the model's parts are in place (the caller makes it resident). */
static corral_status load_fresh(struct core *k, sched_model *sm, corral_error *err) {
    sm->owner = mem_owner_new();
    if (!sm->owner)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "model '%s': no memory owner", sm->name);
    const cfg *c = core_cfg(k);
    /* Everything the model allocates lives in its own arena. */
    const unsigned scope = mem_scope_enter(sm->owner);
    /* The weights the kernels want rearranged are mapped from an image in the cache directory
     * (written on the first load of a file), so a load or swap-in costs no rearranging. */
    const model_params mp = {.compute = MODEL_COMPUTE_FAST, .cache_dir = c->cache_dir};
    model *m = model_load(sm->weights_path, &mp, err);
    model_runner *r = NULL;
    policy_vocab *pv = NULL;
    uint32_t ctx = 0;
    chat_template tmpl = CHAT_TEMPLATE_NONE;
    if (!m) {
        corral_error_prefix(err, "model '%s'", sm->name);
    } else {
        const model_hparams *hp = model_get_hparams(m);
        ctx = (uint32_t)sm->cfg->context;
        if (ctx == 0)
            ctx = hp->n_ctx_train < SCHED_DEFAULT_CONTEXT_CAP ? hp->n_ctx_train
                                                              : SCHED_DEFAULT_CONTEXT_CAP;
        tmpl = prompt_file_chat_template(model_get_gguf(m));
        corral_error why;
        /* A batch step runs a prefill chunk beside one token of each other active job. */
        const uint32_t max_batch =
            (uint32_t)(c->prefill_chunk + c->active_per_model) + SCHED_MAX_REALTIME_EXTRA;
        if (ctx > hp->n_ctx_train)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                             "model '%s': configured context %u exceeds the model's %u", sm->name,
                             ctx, hp->n_ctx_train);
        else if (sm->cfg->chat_template &&
                 (tmpl = chat_template_from_name(sm->cfg->chat_template, &why)) ==
                     CHAT_TEMPLATE_UNKNOWN)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "model '%s': %s", sm->name, why.message);
        else if (!(r = model_runner_new(m, max_batch, k->pool, err)))
            corral_error_prefix(err, "model '%s'", sm->name);
        else if (!(pv = policy_vocab_new(model_get_tokenizer(m), err))) {
            corral_error_prefix(err, "model '%s'", sm->name);
            model_runner_destroy(&r);
        }
    }
    if (!r) {
        model_destroy(&m);
        mem_scope_leave(scope);
        mem_owner_destroy(&sm->owner);
        return err->status;
    }
    mem_scope_leave(scope);
    mem_owner_set_mapped(sm->owner, gguf_file_size(model_get_gguf(m)));
    sm->m = m;
    sm->runner = r;
    sm->pv = pv;
    sm->context = ctx;
    sm->tmpl = tmpl;
    return CORRAL_OK;
}

/* Map a swapped-out model's weights back under what it kept (model_weights_restore): only when
 * they are still at the path it had (a variant's image still valid) and the file is unchanged.
 * false otherwise, with what was kept left for the caller to drop. */
static bool restore_weights(sched_model *sm) {
    if (strcmp(gguf_path(model_get_gguf(sm->m)), sm->weights_path) != 0) return false;
    corral_error err;
    const unsigned scope = mem_scope_enter(sm->owner);
    const corral_status st = model_weights_restore(sm->m, &err);
    mem_scope_leave(scope);
    if (st != CORRAL_OK) {
        log_warn("swapped-out model cannot be restored; loading it again",
                 LOG_STR("model", sm->name), LOG_STR("reason", err.message));
        return false;
    }
    mem_owner_set_mapped(sm->owner, gguf_file_size(model_get_gguf(sm->m)));
    return true;
}

corral_status residency_ensure_loaded(struct core *k, sched_model *sm, int64_t *load_us,
                                      bool *never, corral_error *err) {
    if (never) *never = false;
    if (sm->state == CORE_MODEL_RESIDENT) return CORRAL_OK;
    const uint64_t file = file_bytes(sm->cfg->path);
    /* A swapped-out model that kept its heap only needs room for its weights again. */
    const uint64_t need = residency_kept(sm) ? file : file + MODEL_HEAP_RESERVE + file / 64;
    corral_status st = residency_make_room(k, need, sm, never, err);
    if (st != CORRAL_OK) return st;
    const int64_t t0 = sched__mono_us();
    if ((st = variant_prepare(k, sm, err)) != CORRAL_OK) return st;
    const core_model_state before = sm->state;
    sm->state = CORE_MODEL_LOADING;
    sm->loads++;
    bool restored = false;
    if (before == CORE_MODEL_SWAPPED && sm->m) {
        restored = restore_weights(sm);
        if (!restored) drop_with_sessions(k, sm);
    }
    if (!restored && (st = load_fresh(k, sm, err)) != CORRAL_OK) {
        sm->state = before == CORE_MODEL_SWAPPED ? CORE_MODEL_UNLOADED : before;
        return st;
    }
    if ((st = batch_alloc(k, sm, err)) != CORRAL_OK) {
        residency_drop(sm);
        sm->state = CORE_MODEL_UNLOADED;
        return st;
    }
    sm->state = CORE_MODEL_RESIDENT;
    if (before == CORE_MODEL_SWAPPED) sm->swap_ins++;
    sm->load_us = sched__mono_us() - t0;
    cache_trim(k, model_repack_path(sm->m));
    /* The reservation was a guess: if the model turned out bigger, make room now. */
    corral_error ignored;
    residency_make_room(k, 0, sm, NULL, &ignored);
    if (load_us) *load_us = sm->load_us;
    log_info(before == CORE_MODEL_SWAPPED ? "model swapped in" : "model loaded",
             LOG_STR("model", sm->name), LOG_STR("path", sm->weights_path),
             LOG_STR("arch", model_get_hparams(sm->m)->arch), LOG_UINT("context", sm->context),
             LOG_STR("template", chat_template_name(sm->tmpl)),
             LOG_STR("how", restored ? "weights mapped again" : "loaded from the file"),
             LOG_F64("ms", sm->load_us / 1000.0), LOG_UINT("bytes", residency_model_bytes(sm)));
    return CORRAL_OK;
}

/* ---- configuration --------------------------------------------------------------------------- */

static bool entry_changed(const cfg_model *a, const cfg_model *b) {
    if (a->n_adapters != b->n_adapters || strcmp(a->path, b->path) != 0 ||
        a->context != b->context || a->kv_f32 != b->kv_f32 ||
        (a->chat_template == NULL) != (b->chat_template == NULL) ||
        (b->chat_template && strcmp(a->chat_template, b->chat_template) != 0))
        return true;
    for (size_t i = 0; i < b->n_adapters; i++)
        if (strcmp(a->adapters[i].path, b->adapters[i].path) != 0 ||
            a->adapters[i].scale != b->adapters[i].scale)
            return true;
    return false;
}

void residency_sync(struct core *k, const cfg *c) {
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        const cfg_model *entry = cfg_find_model(c, sm->name);
        if (!entry) {
            sm->removed = true;
            if (residency_kept(sm)) drop_with_sessions(k, sm);
            continue;
        }
        if (sm->cfg && entry_changed(sm->cfg, entry)) {
            sm->reload_pending = sm->state == CORE_MODEL_RESIDENT;
            /* Kept parts of a swapped-out model were made under the old entry. */
            if (residency_kept(sm)) drop_with_sessions(k, sm);
        }
        sm->cfg = entry;
        sm->removed = false;
        if (entry->pin) sm->pinned = true;
    }
    for (size_t i = 0; i < c->n_models; i++) {
        if (residency_find(k, c->models[i].name)) continue;
        sched_model *sm = calloc(1, sizeof *sm);
        if (!sm || !(sm->name = strdup(c->models[i].name))) {
            free(sm);
            log_error("out of memory adding a model", LOG_STR("model", c->models[i].name));
            continue;
        }
        sm->cfg = &c->models[i];
        sm->state = CORE_MODEL_UNLOADED;
        sm->pinned = c->models[i].pin;
        /* Append, so listings keep the config's order. */
        sched_model **pp = &k->models;
        while (*pp) pp = &(*pp)->next;
        *pp = sm;
    }
}

void residency_tick(struct core *k) {
    const int64_t now_ms = sched__unix_ms();
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        const bool expired =
            sm->cfg->ttl_ms && !sm->pinned && now_ms - sm->last_used_ms > sm->cfg->ttl_ms;
        /* A swapped-out model past its keep-alive gives back what it kept, too. */
        if (residency_kept(sm) && expired && !residency_busy(k, sm)) drop_with_sessions(k, sm);
        if (sm->state != CORE_MODEL_RESIDENT || residency_busy(k, sm)) continue;
        /* Gone from the config or changed: unload now that it is idle. Keep-alive ran out: give
         * the memory back to the machine. */
        if (sm->removed || sm->reload_pending || expired)
            residency_release(k, sm, CORE_MODEL_UNLOADED);
    }
}

void residency_free_all(struct core *k) {
    for (sched_model *sm = k->models, *next; sm; sm = next) {
        next = sm->next;
        if (sm->m) residency_release(k, sm, CORE_MODEL_UNLOADED);
        free(sm->weights_path);
        free(sm->name);
        free(sm);
    }
    k->models = NULL;
}
