/*
 * scheduler.c — the scheduler thread (see scheduler.h for the policy).
 *
 * Data, all owned by the scheduler thread except where a lock is named:
 *   inbox      jobs handed over by the server, not yet looked at (lock: mu)
 *   outbox     packed Responses for the server (lock: mu)
 *   jobs       every Generate the scheduler holds, queued or running, in arrival order
 *   models     the configured models (one sched_model per name, kept across reloads)
 *   sessions   conversations whose KV cache stays between requests
 *
 * One loop iteration: take the inbox; answer the quick requests (status, lists, tokenize,
 * load...); end every job that was cancelled or whose deadline passed; then run one step of the
 * job chosen by the priority rule. The thread sleeps on a condition variable when nothing can run.
 */
#include "scheduler.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/chat.h"
#include "corral/log.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"
#include "corral/version.h"
#include "corral/evict.h"
#include "corral/policy.h"
#include "corral/sanitize.h"
#include "lora.h"
#include "mem.h"
#include "swap.h"

enum {
    MODEL_UNLOADED = CORRAL__V1__MODEL_STATE__MODEL_STATE_UNLOADED,
    MODEL_LOADING = CORRAL__V1__MODEL_STATE__MODEL_STATE_LOADING,
    MODEL_RESIDENT = CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT,
    MODEL_SWAPPED = CORRAL__V1__MODEL_STATE__MODEL_STATE_SWAPPED,
};

/* Heap a model needs beyond its file mapping, reserved before loading it (scratch, tokenizer
 * tables): MODEL_HEAP_RESERVE plus a 64th of the file. The accounting then measures the real
 * figure, and the budget is rebalanced right after the load if the guess was short. */
#define MODEL_HEAP_RESERVE (8ull << 20)
/* What the daemon keeps in cache.dir, under one budget (cache.limit). */
#define CACHE_FILE_PREFIXES LORA_CACHE_FILE_PREFIX "|" MODEL_REPACK_FILE_PREFIX
/* How often a request that waits for memory tries again. */
#define MEMORY_RETRY_US    50000

#define DEFAULT_MAX_TOKENS  256
#define DEFAULT_CONTEXT_CAP 4096

typedef struct sched_model {
    char *name;
    const cfg_model *cfg; /* the current configuration entry */
    bool removed;         /* dropped from the config: no new requests; unloaded when idle */
    bool reload_pending;  /* its entry changed: unload when idle, next load uses the new one */
    int state;
    model *m;
    model_runner *runner;
    uint32_t context; /* KV positions per sequence */
    chat_template tmpl;
    bool pinned;
    uint32_t n_queued; /* jobs counted against queue_per_model (waiting or running) */
    uint32_t n_active; /* jobs holding KV state and taking turns */
    uint32_t n_sessions;
    uint64_t served;
    int64_t last_used_ms; /* Unix time */
    uint64_t swap_ins, swap_outs;
    uint64_t loads; /* loads and swap-ins started */
    mem_owner *owner;   /* its memory: a jemalloc arena and the weights' mapping */
    int64_t load_us;    /* how long the last load took (reload cost) */
    int64_t merge_us;   /* a variant's last merge: what losing its cached image would cost */
    uint64_t merges;    /* merges done for it (a cached image spares them) */
    char *weights_path; /* the file mapped: cfg->path, or a variant's merged image */
    policy_vocab *pv;   /* its vocabulary for sanitizers and constraints (cached DFAs) */
    bool verified;      /* a variant's merged image was fully checked once */
    struct sched_model *next;
} sched_model;

/* A conversation kept between requests. Its bookkeeping lives in the default arena (it outlives
 * models); its KV cache belongs to its model's owner, or is on disk while `swapped`. */
typedef struct sched_session {
    char id[128];
    char app[64];
    sched_model *model;
    kv_cache *kv;    /* NULL while swapped out or not yet made */
    bool swapped;    /* the cache is an image in the swap directory */
    int32_t *tokens; /* the ids whose keys and values are in kv, in order */
    uint32_t n_tokens, cap_tokens;
    job *busy; /* the job using it, or NULL */
    int64_t last_used_us;
    int64_t last_used_ms; /* Unix time, for the eviction policy */
    struct sched_session *next;
} sched_session;

typedef struct app_count {
    char app[64];
    uint32_t n;
    struct app_count *next;
} app_count;

/* The sanitizer profiles built from one configuration (plugins loaded, settings checked). */
typedef struct profile_set {
    policy_profile **items;
    size_t n;
} profile_set;

typedef struct cfg_keep {
    cfg *c;
    profile_set profiles;
    struct cfg_keep *next;
} cfg_keep;

struct sched {
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Protected by mu. */
    job *inbox_head, *inbox_tail;
    outmsg *out_head, *out_tail;
    cfg *pending_cfg;
    bool shutdown, quit, idle;
    bool poked;
    /* Scheduler thread only. */
    int notify_fd;
    threadpool *pool; /* compute threads shared by every model (one step at a time) */
    swap_dir *swap;   /* where session caches go when memory is needed */
    const evict_policy *policy;
    profile_set profiles; /* of the current configuration */
    cfg *config;
    cfg_keep *old_configs;
    sched_model *models;
    sched_session *sessions;
    job *jobs; /* Generate jobs, arrival order */
    app_count *apps;
    int64_t started_ms;
    uint64_t served;
};

/* ---- sanitizer profiles ----------------------------------------------------------------------
 */

static void profiles_free(profile_set *ps) {
    for (size_t i = 0; i < ps->n; i++) policy_profile_destroy(&ps->items[i]);
    free(ps->items);
    ps->items = NULL;
    ps->n = 0;
}

/* Build every profile of config c: plugins are loaded and every step's settings checked now, so
 * that a bad one stops startup (or is refused on reload) with a message naming it. */
static corral_status profiles_build(const cfg *c, profile_set *out, corral_error *err) {
    *out = (profile_set){0};
    if (c->n_sanitizers == 0) return CORRAL_OK;
    out->items = calloc(c->n_sanitizers, sizeof *out->items);
    if (!out->items) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < c->n_sanitizers; i++) {
        const cfg_sanitizer *cs = &c->sanitizers[i];
        policy_step_desc steps[POLICY_MAX_STEPS];
        corral_policy_kv *params[POLICY_MAX_STEPS] = {0};
        corral_status st = CORRAL_OK;
        if (cs->n_steps > POLICY_MAX_STEPS)
            st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                  "sanitizer '%s' has %zu steps; at most %d", cs->name,
                                  cs->n_steps, POLICY_MAX_STEPS);
        for (size_t k = 0; st == CORRAL_OK && k < cs->n_steps; k++) {
            const cfg_policy_step *cstep = &cs->steps[k];
            if (cstep->n_params) {
                params[k] = calloc(cstep->n_params, sizeof *params[k]);
                if (!params[k]) {
                    st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
                    break;
                }
            }
            for (size_t q = 0; q < cstep->n_params; q++)
                params[k][q] = (corral_policy_kv){.key = cstep->params[q].key,
                                                  .value = cstep->params[q].value};
            steps[k] = (policy_step_desc){.kind = cstep->kind,
                                          .path = cstep->path,
                                          .params = params[k],
                                          .n_params = cstep->n_params};
        }
        if (st == CORRAL_OK) {
            out->items[out->n] = policy_profile_new(cs->name, steps, cs->n_steps, err);
            if (out->items[out->n])
                out->n++;
            else
                st = err->status;
        }
        for (size_t k = 0; k < POLICY_MAX_STEPS; k++) free(params[k]);
        if (st != CORRAL_OK) {
            profiles_free(out);
            return st;
        }
    }
    return CORRAL_OK;
}

/* ---- time ----------------------------------------------------------------------------------- */

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- outbox -----------------------------------------------------------------------------------
 */

/* Pack resp for j's peer and queue it; final marks the job's last message. */
static void emit(sched *s, job *j, Corral__V1__Response *resp, bool final) {
    resp->id = j->id;
    /* Messages outlive any model: never allocate them in a model's arena. */
    const unsigned scope = mem_scope_default();
    outmsg *m = calloc(1, sizeof *m);
    size_t len = corral__v1__response__get_packed_size(resp);
    uint8_t *data = malloc(len ? len : 1);
    if (!m || !data) {
        /* Out of memory: the message is lost; a final one must still free the job. */
        log_error("out of memory queueing a response", LOG_UINT("id", j->id));
        free(data);
        data = NULL;
        if (!m) {
            mem_scope_leave(scope);
            return;
        }
        len = 0;
    } else {
        corral__v1__response__pack(resp, data);
    }
    m->job = j;
    m->data = data;
    m->len = data ? len : 0;
    m->final = final;
    mem_scope_leave(scope);
    pthread_mutex_lock(&s->mu);
    if (s->out_tail)
        s->out_tail->next = m;
    else
        s->out_head = m;
    s->out_tail = m;
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    if (write(s->notify_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("cannot wake the server", LOG_STR("error", strerror(errno)));
}

static void emit_error(sched *s, job *j, corral_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void emit_error(sched *s, job *j, corral_status code, const char *fmt, ...) {
    char message[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    Corral__V1__Error e = CORRAL__V1__ERROR__INIT;
    e.code = (Corral__V1__ErrorCode)(-code);
    e.message = message;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_ERROR;
    r.error = &e;
    log_debug("request failed", LOG_UINT("id", j->id), LOG_STR("code", corral_status_name(code)),
              LOG_STR("message", message));
    emit(s, j, &r, true);
}

static void emit_ack(sched *s, job *j, const char *message) {
    Corral__V1__Ack a = CORRAL__V1__ACK__INIT;
    a.message = (char *)message;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_ACK;
    r.ack = &a;
    emit(s, j, &r, true);
}

/* ---- models -----------------------------------------------------------------------------------
 */

static sched_model *model_find(sched *s, const char *name) {
    for (sched_model *m = s->models; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* ---- memory ------------------------------------------------------------------------------------
 *
 * Every resident model is a memory owner (mem.h): its weights' mapping plus its jemalloc arena,
 * which holds its runner, the KV caches of its requests and sessions, and its requests' buffers.
 * The budget is memory.limit. Before anything grows — a model loads, a request or a session gets
 * a KV cache — make_room() checks the total: under high_watermark x limit nothing happens; above
 * it, idle state is evicted in the policy's order (memory.policy) until the total fits under
 * low_watermark x limit, so that the next requests find room without evicting again. Idle
 * sessions' caches go to the swap directory; idle models are swapped out (their sessions' caches
 * written out first): the weights are unmapped, and what is small but slow to rebuild — the
 * tokenizer, the runner's scratch, the policy vocabulary, a few MiB that stay charged to the model
 * — is kept, so that a swap-in only maps the weights again (model_weights_restore). When evicting
 * every resident model is not enough, those kept parts go too, least recently used first. Pinned
 * models and anything a request is using are never candidates. If the state still does not fit
 * under the limit, the request waits (its deadline, else limits.memory_wait_ms) and then fails
 * with RESOURCE_EXHAUSTED naming what holds the memory. */

static uint64_t model_bytes(const sched_model *sm) {
    return sm->owner ? mem_owner_bytes(sm->owner) : 0;
}

static uint64_t total_bytes(sched *s) {
    uint64_t total = 0;
    for (sched_model *sm = s->models; sm; sm = sm->next) total += model_bytes(sm);
    return total;
}

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Bytes of a KV cache of n_ctx positions for a resident model. */
static uint64_t kv_bytes_for(const sched_model *sm, uint32_t n_ctx) {
    const model_hparams *hp = model_get_hparams(sm->m);
    return 2ull * hp->n_layer * n_ctx * hp->n_head_kv * hp->head_dim * (sm->cfg->kv_f32 ? 4 : 2);
}

/* A KV cache charged to the model. */
static kv_cache *model_kv_new(sched_model *sm, uint32_t n_ctx, corral_error *err) {
    const unsigned scope = mem_scope_enter(sm->owner);
    kv_cache *kv = kv_cache_new(sm->m, n_ctx, sm->cfg->kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16, err);
    mem_scope_leave(scope);
    if (kv) mem_owner_add_known(sm->owner, (int64_t)kv_cache_bytes(kv));
    return kv;
}

static void model_kv_free(sched_model *sm, kv_cache **kv) {
    if (!*kv) return;
    mem_owner_add_known(sm->owner, -(int64_t)kv_cache_bytes(*kv));
    kv_cache_destroy(kv);
}

static bool model_busy(sched *s, const sched_model *sm) {
    for (job *j = s->jobs; j; j = j->next)
        if (j->model == sm) return true;
    for (sched_session *ss = s->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->busy) return true;
    return false;
}

static swap_session_key session_key(const sched_session *ss) {
    return (swap_session_key){.app = ss->app,
                              .session = ss->id,
                              .model_name = ss->model->name,
                              .model_path = ss->model->cfg->path,
                              .context = ss->model->context,
                              .kv_f32 = ss->model->cfg->kv_f32};
}

/* Write an idle session's cache to the swap directory (or drop it when that is impossible: the
 * client resends the conversation's text each turn, so only recomputation is lost) and free it. */
static void session_swap_out(sched *s, sched_session *ss) {
    if (!ss->kv) return;
    const uint32_t n = kv_cache_n_pos(ss->kv);
    ss->swapped = false;
    if (n > 0) {
        const swap_session_key key = session_key(ss);
        corral_error err;
        if (!swap_dir_writable(s->swap))
            log_warn("session state dropped: the swap directory is not writable",
                     LOG_STR("session", ss->id), LOG_STR("dir", swap_dir_path(s->swap)));
        else if (swap_session_write(s->swap, &key, ss->kv, ss->tokens, n, &err) != CORRAL_OK)
            log_warn("session state dropped: it could not be swapped out",
                     LOG_STR("session", ss->id), LOG_STR("error", err.message));
        else
            ss->swapped = true;
    }
    if (!ss->swapped) ss->n_tokens = 0;
    log_debug("session swapped out", LOG_STR("session", ss->id), LOG_UINT("positions", n),
              LOG_INT("on_disk", ss->swapped));
    model_kv_free(ss->model, &ss->kv);
}

/* Free everything a model holds: runner, vocabulary, model, arena. */
static void model_drop(sched_model *sm) {
    model_runner_destroy(&sm->runner);
    policy_vocab_destroy(&sm->pv);
    model_destroy(&sm->m);
    mem_owner_destroy(&sm->owner);
}

/* Whether a swapped-out model kept its tokenizer, runner and vocabulary (see above). */
static bool model_kept(const sched_model *sm) {
    return sm->state == MODEL_SWAPPED && sm->m != NULL;
}

/* Release a resident model: its sessions' caches go to disk, its weights are unmapped. `state` is
 * what it becomes: SWAPPED (evicted to make room, comes back on demand: the rest is kept) or
 * UNLOADED (asked for, or its ttl passed: everything is freed, its arena destroyed). Also frees
 * what a SWAPPED model kept. The caller made sure no request uses it. */
static void model_release(sched *s, sched_model *sm, int state) {
    for (sched_session *ss = s->sessions; ss; ss = ss->next)
        if (ss->model == sm) session_swap_out(s, ss);
    if (state == MODEL_SWAPPED && sm->state == MODEL_RESIDENT) {
        model_weights_release(sm->m);
        mem_owner_set_mapped(sm->owner, 0);
    } else {
        model_drop(sm);
    }
    if (sm->state == MODEL_RESIDENT) {
        if (state == MODEL_SWAPPED) sm->swap_outs++;
        log_info(state == MODEL_SWAPPED ? "model swapped out" : "model unloaded",
                 LOG_STR("model", sm->name));
    }
    sm->state = state;
    sm->reload_pending = false;
}

/* A message listing what holds memory, for requests that cannot get room. */
static void describe_holders(sched *s, char *out, size_t size) {
    size_t len = (size_t)snprintf(
        out, size, "memory limit %.1f MiB is held by:", s->config->memory_limit / 1048576.0);
    int any = 0;
    for (sched_model *sm = s->models; sm && len < size; sm = sm->next) {
        if (!model_bytes(sm)) continue;
        uint32_t running = 0;
        for (job *j = s->jobs; j; j = j->next) running += j->model == sm && j->started;
        len += (size_t)snprintf(out + len, size - len, "%s model '%s' %.1f MiB%s%s%s",
                                any++ ? "," : "", sm->name, model_bytes(sm) / 1048576.0,
                                sm->pinned ? " (pinned)" : "",
                                running ? " (requests running)" : "",
                                model_kept(sm) ? " (swapped out, tokenizer and scratch kept)" : "");
    }
    if (!any && len < size) snprintf(out + len, size - len, " nothing evictable");
}

/* Make `need` more bytes fit (see the essay above). `protect` is never evicted (the model the
 * room is for). Returns CORRAL_OK, or CORRAL_RESOURCE_EXHAUSTED with err naming the holders. */
static corral_status make_room(sched *s, uint64_t need, const sched_model *protect,
                               corral_error *err) {
    const uint64_t limit = s->config->memory_limit;
    const uint64_t high = (uint64_t)(s->config->high_watermark * (double)limit);
    const uint64_t low = (uint64_t)(s->config->low_watermark * (double)limit);
    if (need > limit)
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "%.1f MiB are needed but memory.limit is %.1f MiB",
                                need / 1048576.0, limit / 1048576.0);
    uint64_t total = total_bytes(s);
    if (total + need <= high) return CORRAL_OK;
    const uint64_t target = need > low ? limit : low;
    while (total + need > target) {
        enum { MAX_CANDIDATES = 512 };
        evict_candidate c[MAX_CANDIDATES];
        int n = 0;
        for (sched_session *ss = s->sessions; ss && n < MAX_CANDIDATES; ss = ss->next)
            if (ss->kv && !ss->busy)
                c[n++] = (evict_candidate){.kind = EVICT_KIND_SESSION,
                                           .last_used_ms = ss->last_used_ms,
                                           .bytes = kv_cache_bytes(ss->kv),
                                           .reload_bytes = kv_cache_bytes(ss->kv),
                                           .user = ss};
        for (sched_model *sm = s->models; sm && n < MAX_CANDIDATES; sm = sm->next)
            if (sm->state == MODEL_RESIDENT && !sm->pinned && sm != protect && !model_busy(s, sm))
                c[n++] = (evict_candidate){.kind = EVICT_KIND_MODEL,
                                           .last_used_ms = sm->last_used_ms,
                                           .bytes = model_bytes(sm),
                                           .reload_bytes = mem_owner_mapped_bytes(sm->owner),
                                           .rebuild_us = (uint64_t)sm->merge_us,
                                           .user = sm};
        int k = evict_pick(s->policy, c, n, unix_ms());
        if (k < 0) {
            /* Nothing resident is left to evict: what swapped-out models kept, oldest first. */
            sched_model *oldest = NULL;
            for (sched_model *sm = s->models; sm; sm = sm->next)
                if (model_kept(sm) && sm != protect &&
                    (!oldest || sm->last_used_ms < oldest->last_used_ms))
                    oldest = sm;
            if (!oldest) break;
            model_drop(oldest);
            total = total_bytes(s);
            continue;
        }
        if (c[k].kind == EVICT_KIND_SESSION)
            session_swap_out(s, c[k].user);
        else
            model_release(s, c[k].user, MODEL_SWAPPED);
        total = total_bytes(s);
    }
    if (total + need <= limit) return CORRAL_OK;
    char holders[CORRAL_ERROR_MESSAGE_MAX - 96];
    describe_holders(s, holders, sizeof holders);
    return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED, "no room for %.1f MiB: %s",
                            need / 1048576.0, holders);
}

/* Set sm->weights_path: the model's own file, or for a variant the merged image in cache.dir,
 * merging its adapters first when the cache has no valid image (the merge runs on the compute
 * pool, between requests' steps). */
static corral_status variant_prepare(sched *s, sched_model *sm, corral_error *err) {
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
            sources[i] = (lora_source){.path = mc->adapters[i].path, .scale = mc->adapters[i].scale};
        const lora_variant_request req = {
            .base_path = mc->path,
            .adapters = sources,
            .n_adapters = (uint32_t)mc->n_adapters,
            .cache_dir = s->config->cache_dir,
            .cache_limit_bytes = s->config->cache_limit,
            .pool = s->pool,
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
static void cache_trim(const sched *s, const char *in_use) {
    if (!in_use || s->config->cache_limit == 0) return;
    const char *slash = strrchr(in_use, '/');
    corral_error err;
    image_trim_report rep;
    if (image_dir_trim(s->config->cache_dir, CACHE_FILE_PREFIXES, s->config->cache_limit,
                       slash ? slash + 1 : in_use, &rep, &err) != CORRAL_OK)
        log_warn("cannot trim the cache directory", LOG_STR("dir", s->config->cache_dir),
                 LOG_STR("error", err.message));
    else if (rep.n_removed)
        log_info("cache directory trimmed", LOG_STR("dir", s->config->cache_dir),
                 LOG_UINT("removed", rep.n_removed), LOG_F64("mib_removed", rep.bytes_removed / 1048576.0));
}

/* Load sm from scratch (its weights_path): model, runner, vocabulary, in an arena of its own. On
 * success the model is resident. */
static corral_status model_load_fresh(sched *s, sched_model *sm, corral_error *err) {
    sm->owner = mem_owner_new();
    if (!sm->owner)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "model '%s': no memory owner", sm->name);
    /* Everything the model allocates lives in its own arena. */
    const unsigned scope = mem_scope_enter(sm->owner);
    /* The weights the kernels want rearranged are mapped from an image in the cache directory
     * (written on the first load of a file), so a load or swap-in costs no rearranging. */
    const model_params mp = {.compute = MODEL_COMPUTE_FAST, .cache_dir = s->config->cache_dir};
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
            ctx = hp->n_ctx_train < DEFAULT_CONTEXT_CAP ? hp->n_ctx_train : DEFAULT_CONTEXT_CAP;
        tmpl = prompt_file_chat_template(model_get_gguf(m));
        corral_error why;
        if (ctx > hp->n_ctx_train)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                             "model '%s': configured context %u exceeds the model's %u", sm->name,
                             ctx, hp->n_ctx_train);
        else if (sm->cfg->chat_template &&
                 (tmpl = chat_template_from_name(sm->cfg->chat_template, &why)) ==
                     CHAT_TEMPLATE_UNKNOWN)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "model '%s': %s", sm->name, why.message);
        else if (!(r = model_runner_new(m, (uint32_t)s->config->prefill_chunk, s->pool, err)))
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
static bool model_restore(sched_model *sm) {
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

static corral_status model_ensure_loaded(sched *s, sched_model *sm, int64_t *load_us,
                                         corral_error *err) {
    if (sm->state == MODEL_RESIDENT) return CORRAL_OK;
    const uint64_t file = file_bytes(sm->cfg->path);
    /* A swapped-out model that kept its heap only needs room for its weights again. */
    const uint64_t need = model_kept(sm) ? file : file + MODEL_HEAP_RESERVE + file / 64;
    corral_status st = make_room(s, need, sm, err);
    if (st != CORRAL_OK) return st;
    const int64_t t0 = mono_us();
    if ((st = variant_prepare(s, sm, err)) != CORRAL_OK) return st;
    const int before = sm->state;
    sm->state = MODEL_LOADING;
    sm->loads++;
    bool restored = false;
    if (before == MODEL_SWAPPED && sm->m) {
        restored = model_restore(sm);
        if (!restored) model_drop(sm);
    }
    if (!restored && (st = model_load_fresh(s, sm, err)) != CORRAL_OK) {
        sm->state = before;
        return st;
    }
    sm->state = MODEL_RESIDENT;
    if (before == MODEL_SWAPPED) sm->swap_ins++;
    sm->load_us = mono_us() - t0;
    cache_trim(s, model_repack_path(sm->m));
    /* The reservation was a guess: if the model turned out bigger, make room now. */
    corral_error ignored;
    make_room(s, 0, sm, &ignored);
    if (load_us) *load_us = sm->load_us;
    log_info(before == MODEL_SWAPPED ? "model swapped in" : "model loaded",
             LOG_STR("model", sm->name), LOG_STR("path", sm->weights_path),
             LOG_STR("arch", model_get_hparams(sm->m)->arch), LOG_UINT("context", sm->context),
             LOG_STR("template", chat_template_name(sm->tmpl)),
             LOG_STR("how", restored ? "weights mapped again" : "loaded from the file"),
             LOG_F64("ms", sm->load_us / 1000.0), LOG_UINT("bytes", model_bytes(sm)));
    return CORRAL_OK;
}

/* Bring the model list in line with config c (at start and on reload). */
static void models_sync(sched *s, cfg *c) {
    for (sched_model *sm = s->models; sm; sm = sm->next) {
        const cfg_model *entry = cfg_find_model(c, sm->name);
        if (!entry) {
            sm->removed = true;
            if (model_kept(sm)) model_drop(sm);
            continue;
        }
        bool adapters_changed = sm->cfg && sm->cfg->n_adapters != entry->n_adapters;
        for (size_t k = 0; sm->cfg && !adapters_changed && k < entry->n_adapters; k++)
            adapters_changed = strcmp(sm->cfg->adapters[k].path, entry->adapters[k].path) != 0 ||
                               sm->cfg->adapters[k].scale != entry->adapters[k].scale;
        if (sm->cfg &&
            (adapters_changed || strcmp(sm->cfg->path, entry->path) != 0 ||
             sm->cfg->context != entry->context ||
             sm->cfg->kv_f32 != entry->kv_f32 ||
             (sm->cfg->chat_template == NULL) != (entry->chat_template == NULL) ||
             (entry->chat_template && strcmp(sm->cfg->chat_template, entry->chat_template) != 0))) {
            sm->reload_pending = sm->state == MODEL_RESIDENT;
            /* Kept parts of a swapped-out model were made under the old entry. */
            if (model_kept(sm)) model_drop(sm);
        }
        sm->cfg = entry;
        sm->removed = false;
        if (entry->pin) sm->pinned = true;
    }
    for (size_t i = 0; i < c->n_models; i++) {
        if (model_find(s, c->models[i].name)) continue;
        sched_model *sm = calloc(1, sizeof *sm);
        if (!sm || !(sm->name = strdup(c->models[i].name))) {
            free(sm);
            log_error("out of memory adding a model", LOG_STR("model", c->models[i].name));
            continue;
        }
        sm->cfg = &c->models[i];
        sm->state = MODEL_UNLOADED;
        sm->pinned = c->models[i].pin;
        /* Append, so listings keep the config's order. */
        sched_model **pp = &s->models;
        while (*pp) pp = &(*pp)->next;
        *pp = sm;
    }
}

/* ---- sessions ---------------------------------------------------------------------------------
 */

/* Forget a session entirely: its cache, its image on disk, its bookkeeping. */
static void session_free(sched *s, sched_session *ss) {
    for (sched_session **pp = &s->sessions; *pp; pp = &(*pp)->next)
        if (*pp == ss) {
            *pp = ss->next;
            break;
        }
    if (ss->model) {
        ss->model->n_sessions--;
        model_kv_free(ss->model, &ss->kv);
        if (ss->swapped) {
            const swap_session_key key = session_key(ss);
            swap_session_discard(s->swap, &key);
        }
    }
    free(ss->tokens);
    free(ss);
}

static size_t session_count(sched *s) {
    size_t n = 0;
    for (sched_session *ss = s->sessions; ss; ss = ss->next) n++;
    return n;
}

/* Drop idle sessions past their TTL, and the least recently used idle ones above the limit. */
static void sessions_expire(sched *s) {
    const int64_t now = mono_us();
    for (sched_session *ss = s->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (!ss->busy && now - ss->last_used_us > s->config->session_ttl_ms * 1000LL) {
            log_debug("session expired", LOG_STR("session", ss->id), LOG_STR("app", ss->app));
            session_free(s, ss);
        }
    }
    while (session_count(s) > (size_t)s->config->max_sessions) {
        sched_session *oldest = NULL;
        for (sched_session *ss = s->sessions; ss; ss = ss->next)
            if (!ss->busy && (!oldest || ss->last_used_us < oldest->last_used_us)) oldest = ss;
        if (!oldest) break;
        session_free(s, oldest);
    }
}

/* ---- per-app accounting ------------------------------------------------------------------------
 */

static app_count *app_counter(sched *s, const char *app) {
    for (app_count *a = s->apps; a; a = a->next)
        if (strcmp(a->app, app) == 0) return a;
    app_count *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    snprintf(a->app, sizeof a->app, "%s", app);
    a->next = s->apps;
    s->apps = a;
    return a;
}

/* ---- finishing jobs ----------------------------------------------------------------------------
 */

/* Release everything the scheduler holds for j and unlink it from the job list. The final message
 * must be emitted by the caller right after (the job is freed by the server once sent). */
static void job_release(sched *s, job *j) {
    for (job **pp = &s->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    j->next = NULL;
    gen_destroy(&j->gen);
    policy_gen_destroy(&j->pg); /* after the generator that used it */
    if (j->session) {
        sched_session *ss = j->session;
        /* The session keeps what is in its cache: prompt ids, then generated ids, as far as the
         * cache holds them (the last sampled token was never run). */
        uint32_t n = kv_cache_n_pos(ss->kv);
        uint32_t total = j->n_prompt + j->n_generated;
        if (n > total) n = total;
        if (n > ss->cap_tokens) {
            /* Session bookkeeping outlives models: the default arena. */
            const unsigned scope = mem_scope_default();
            int32_t *grown = realloc(ss->tokens, n * sizeof *grown);
            mem_scope_leave(scope);
            if (grown) {
                ss->tokens = grown;
                ss->cap_tokens = n;
            } else {
                n = 0; /* cannot remember the history: start afresh next time */
            }
        }
        for (uint32_t i = 0; i < n; i++)
            ss->tokens[i] = i < j->n_prompt ? j->prompt[i] : j->generated[i - j->n_prompt];
        ss->n_tokens = n;
        kv_cache_truncate(ss->kv, n);
        ss->busy = NULL;
        ss->last_used_us = mono_us();
        ss->last_used_ms = unix_ms();
        j->session = NULL;
        j->kv = NULL;
    } else if (j->kv) {
        model_kv_free(j->model, &j->kv);
    }
    /* Buffers allocated in the model's arena must go before the model can: the job itself is
     * freed later, by the server. */
    free(j->prompt);
    free(j->generated);
    free(j->text);
    j->prompt = NULL;
    j->generated = NULL;
    j->text = NULL;
    j->n_prompt = j->n_generated = j->cap_generated = 0;
    j->text_len = j->text_cap = 0;
    if (j->model) {
        if (j->active) j->model->n_active--;
        if (j->counted) j->model->n_queued--;
    }
    if (j->counted) {
        app_count *a = app_counter(s, j->app);
        if (a && a->n) a->n--;
    }
    j->active = j->counted = false;
}

static void finish_error(sched *s, job *j, corral_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void finish_error(sched *s, job *j, corral_status code, const char *fmt, ...) {
    char message[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    job_release(s, j);
    emit_error(s, j, code, "%s", message);
}

/* The job's last Chunk (non-streaming) and Done. */
static void finish_done(sched *s, job *j, Corral__V1__StopReason reason) {
    const Corral__V1__Generate *g = j->req->generate;
    if (!g->stream) {
        Corral__V1__Chunk c = CORRAL__V1__CHUNK__INIT;
        char empty = '\0';
        c.text = j->text ? j->text : &empty;
        if (j->text) j->text[j->text_len] = '\0';
        c.n_token_ids = j->n_generated;
        c.token_ids = j->generated;
        c.index = 0;
        Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
        r.body_case = CORRAL__V1__RESPONSE__BODY_CHUNK;
        r.chunk = &c;
        emit(s, j, &r, false);
    }
    Corral__V1__Timings t = CORRAL__V1__TIMINGS__INIT;
    t.queue_us = (uint64_t)(j->started_us - j->received_us);
    t.load_us = (uint64_t)j->load_us;
    t.prefill_us = (uint64_t)j->prefill_us;
    t.decode_us = (uint64_t)j->decode_us;
    t.total_us = (uint64_t)(mono_us() - j->received_us);
    Corral__V1__Done d = CORRAL__V1__DONE__INIT;
    d.stop_reason = reason;
    d.prompt_tokens = j->n_prompt;
    d.prefilled_tokens = j->n_prompt - j->n_cached;
    d.generated_tokens = j->n_generated;
    d.timings = &t;
    d.model = j->model->name;
    if (j->sanitizer_report) d.sanitizer_report = j->sanitizer_report;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_DONE;
    r.done = &d;
    j->model->served++;
    s->served++;
    log_debug("generation done", LOG_UINT("id", j->id), LOG_STR("model", j->model->name),
              LOG_UINT("prompt", j->n_prompt), LOG_UINT("prefilled", d.prefilled_tokens),
              LOG_UINT("generated", j->n_generated), LOG_UINT("reason", reason));
    job_release(s, j);
    emit(s, j, &r, true);
}

/* ---- starting a Generate -----------------------------------------------------------------------
 */

/* Merge request, model defaults and engine defaults into generation parameters; validate. */
static corral_status build_params(const job *j, const sched_model *sm, gen_params *gp,
                                  uint32_t *max_tokens, corral_error *err) {
    const Corral__V1__Generate *g = j->req->generate;
    const cfg_sampling *d = &sm->cfg->defaults;
    *gp = gen_params_default();
    sampler_params *sp = &gp->sampling;
#define PICK(field, req_field, cfg_field, cast)    \
    do {                                           \
        if (g->req_field)                          \
            sp->field = (cast)g->req_field->value; \
        else if (d->has_##cfg_field)               \
            sp->field = (cast)d->cfg_field;        \
    } while (0)
    PICK(temperature, temperature, temperature, float);
    PICK(top_k, top_k, top_k, int32_t);
    PICK(top_p, top_p, top_p, float);
    PICK(min_p, min_p, min_p, float);
    PICK(repeat_penalty, repeat_penalty, repeat_penalty, float);
    PICK(presence_penalty, presence_penalty, presence_penalty, float);
    PICK(frequency_penalty, frequency_penalty, frequency_penalty, float);
    PICK(penalty_last_n, penalty_last_n, penalty_last_n, int32_t);
#undef PICK
    /* No seed: a fresh one, so that two requests do not sample alike by accident. */
    sp->seed = g->seed
                   ? g->seed->value
                   : ((uint64_t)mono_us() * 0x9E3779B97F4A7C15ull) ^ (j->id << 17) ^ j->received_us;
    corral_status st = sampler_validate_params(sp, err);
    if (st != CORRAL_OK) return st;
    uint64_t mt = g->max_tokens
                      ? g->max_tokens->value
                      : (d->has_max_tokens ? (uint64_t)d->max_tokens : DEFAULT_MAX_TOKENS);
    if (mt == 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "max_tokens must be at least 1");
    if (mt > sm->context)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "max_tokens %llu exceeds the context of model '%s' (%u)",
                                (unsigned long long)mt, sm->name, sm->context);
    *max_tokens = (uint32_t)mt;
    if (g->n_stop > 16)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "at most 16 stop strings, got %zu",
                                g->n_stop);
    for (size_t i = 0; i < g->n_stop; i++)
        if (!g->stop[i][0] || strlen(g->stop[i]) > 256)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "stop string %zu must be 1 to 256 bytes", i);
    gp->max_tokens = *max_tokens;
    gp->stop = (const char *const *)g->stop;
    gp->n_stop = g->n_stop;
    return CORRAL_OK;
}

/* The sanitizer profile a job runs under: the request's, else its app's, else its model's; NULL
 * for none. The names were checked at admission and configuration time. */
static const policy_profile *profile_find(const sched *s, const char *name) {
    for (size_t i = 0; name && i < s->profiles.n; i++)
        if (strcmp(policy_profile_name(s->profiles.items[i]), name) == 0)
            return s->profiles.items[i];
    return NULL;
}

static corral_status job_profile(sched *s, const job *j, const policy_profile **out,
                                 corral_error *err) {
    const char *name = j->req->generate->sanitizer[0] ? j->req->generate->sanitizer : NULL;
    const cfg_app *app = cfg_find_app(s->config, j->app);
    if (!name && app) name = app->sanitizer;
    if (!name) name = j->model->cfg->sanitizer;
    *out = profile_find(s, name);
    if (name && !*out)
        return corral_error_set(err, CORRAL_NOT_FOUND, "sanitizer profile '%s' is not configured",
                                name);
    return CORRAL_OK;
}

/* Run the profile over every piece of user text (the prompt, or each message's content) and
 * tokenize what comes out. The report of the last piece (or the first rejection) goes to the job:
 * it is part of Done, or of the Error's message. */
static corral_status tokenize_request(sched *s, job *j, const sched_model *sm,
                                      const policy_profile *profile, int32_t **ids, size_t *n,
                                      corral_error *err) {
    const Corral__V1__Generate *g = j->req->generate;
    const tokenizer *tok = model_get_tokenizer(sm->m);
    (void)s;
    const size_t n_texts = g->n_messages ? g->n_messages : 1;
    char **clean = calloc(n_texts, sizeof *clean);
    if (!clean) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    corral_status st = CORRAL_OK;
    sanitize_report report = {0};
    for (size_t i = 0; i < n_texts && st == CORRAL_OK; i++) {
        const char *text = g->n_messages ? g->messages[i]->content : g->prompt;
        size_t len;
        st = policy_sanitize(profile, sm->pv, text, strlen(text), &clean[i], &len, &report, err);
        if (st == CORRAL_OK && strlen(clean[i]) != len)
            st = corral_error_set(err, CORRAL_SANITIZER_REJECTED,
                                  "the input contains NUL bytes (message %zu)", i);
    }
    if (profile) {
        char line[512];
        sanitize_report_format(&report, line, sizeof line);
        /* The job outlives the model's arena (the server frees it): the default arena. */
        const unsigned scope = mem_scope_default();
        free(j->sanitizer_report);
        j->sanitizer_report = strdup(line);
        mem_scope_leave(scope);
        if (st == CORRAL_SANITIZER_REJECTED) {
            /* Keep the rejection first, then what each step saw. */
            char message[CORRAL_ERROR_MESSAGE_MAX];
            snprintf(message, sizeof message, "%s", err->message);
            corral_error_set(err, st, "%.300s (report: %.180s)", message, line);
        }
    }
    if (st == CORRAL_OK) {
        if (g->n_messages == 0) {
            st = prompt_tokenize_text(tok, clean[0], strlen(clean[0]), ids, n, err);
        } else {
            chat_template tmpl = sm->tmpl;
            if (g->template_[0]) {
                tmpl = chat_template_from_name(g->template_, err);
                if (tmpl == CHAT_TEMPLATE_UNKNOWN) st = err->status = CORRAL_INVALID_ARGUMENT;
            }
            chat_message *msgs = st == CORRAL_OK ? malloc(n_texts * sizeof *msgs) : NULL;
            if (st == CORRAL_OK && !msgs) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            for (size_t i = 0; msgs && i < n_texts; i++)
                msgs[i] = (chat_message){.role = g->messages[i]->role, .content = clean[i]};
            if (msgs) st = prompt_tokenize_chat(tok, tmpl, msgs, n_texts, ids, n, err);
            free(msgs);
        }
    }
    for (size_t i = 0; i < n_texts; i++) free(clean[i]);
    free(clean);
    return st;
}

/* Find the job's session, or make one (its image on disk, from before a restart, is picked up);
 * checks ownership and the model. Session bookkeeping lives in the default arena. */
static corral_status session_attach(sched *s, job *j, corral_error *err) {
    const char *id = j->req->generate->session;
    for (sched_session *ss = s->sessions; ss; ss = ss->next) {
        if (strcmp(ss->id, id) != 0) continue;
        if (strcmp(ss->app, j->app) != 0)
            return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                    "session '%s' belongs to another app", id);
        if (ss->model != j->model) {
            if (ss->busy)
                return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                        "session '%s' is in use with model '%s'", id,
                                        ss->model->name);
            /* Moving a session to another model starts it afresh. */
            if (ss->swapped) {
                const swap_session_key key = session_key(ss);
                swap_session_discard(s->swap, &key);
                ss->swapped = false;
            }
            model_kv_free(ss->model, &ss->kv);
            ss->model->n_sessions--;
            ss->n_tokens = 0;
            ss->model = j->model;
            j->model->n_sessions++;
        }
        j->session = ss;
        return CORRAL_OK;
    }
    if (strlen(id) >= sizeof(((sched_session *)0)->id))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "session id longer than 127 bytes");
    const unsigned scope = mem_scope_default();
    sched_session *ss = calloc(1, sizeof *ss);
    mem_scope_leave(scope);
    if (!ss) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    snprintf(ss->id, sizeof ss->id, "%s", id);
    snprintf(ss->app, sizeof ss->app, "%s", j->app);
    ss->model = j->model;
    ss->last_used_us = mono_us();
    ss->last_used_ms = unix_ms();
    const swap_session_key key = session_key(ss);
    ss->swapped = swap_session_exists(s->swap, &key);
    j->model->n_sessions++;
    ss->next = s->sessions;
    s->sessions = ss;
    j->session = ss;
    return CORRAL_OK;
}

/* Bring a swapped session's cache back (kv is allocated, empty). A bad or stale image is
 * discarded with a warning and the session starts again from the request's text: the request
 * still succeeds, it just prefills more. */
static void session_swap_in(sched *s, sched_session *ss) {
    const swap_session_key key = session_key(ss);
    int32_t *tokens = NULL;
    uint32_t n = 0;
    corral_error err;
    const unsigned scope = mem_scope_default();
    corral_status st = swap_session_read(s->swap, &key, ss->kv, &tokens, &n, &err);
    mem_scope_leave(scope);
    ss->swapped = false;
    if (st != CORRAL_OK) {
        log_warn("session image discarded; the conversation is recomputed",
                 LOG_STR("session", ss->id), LOG_STR("error", err.message));
        ss->n_tokens = 0;
        return;
    }
    free(ss->tokens);
    ss->tokens = tokens;
    ss->cap_tokens = ss->n_tokens = n;
    log_debug("session swapped in", LOG_STR("session", ss->id), LOG_UINT("positions", n));
}

/* Everything before the first compute step: model, parameters, prompt, cache, generator.
 * Returns CORRAL_OK, an error for the client, or — with *wait set — CORRAL_RESOURCE_EXHAUSTED
 * when memory cannot be found now (err says what holds it) and the job should wait. A job that
 * waits keeps nothing from the attempt. */
static corral_status job_start(sched *s, job *j, bool *wait, corral_error *err) {
    sched_model *sm = j->model;
    *wait = false;
    corral_status st = model_ensure_loaded(s, sm, &j->load_us, err);
    if (st == CORRAL_RESOURCE_EXHAUSTED) *wait = true;
    if (st != CORRAL_OK) return st;
    gen_params gp;
    uint32_t max_tokens = 0;
    if ((st = build_params(j, sm, &gp, &max_tokens, err)) != CORRAL_OK) return st;

    const policy_profile *profile = NULL;
    if ((st = job_profile(s, j, &profile, err)) != CORRAL_OK) return st;

    const unsigned scope = mem_scope_enter(sm->owner);
    size_t n_prompt = 0;
    st = tokenize_request(s, j, sm, profile, &j->prompt, &n_prompt, err);
    if (st == CORRAL_OK && n_prompt == 0)
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "the prompt is empty and model '%s' adds no BOS token", sm->name);
    if (st == CORRAL_OK && n_prompt >= sm->context)
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "the prompt has %zu tokens; the context of model '%s' holds %u",
                              n_prompt, sm->name, sm->context);
    j->n_prompt = (uint32_t)n_prompt;
    if (st == CORRAL_OK) {
        j->cap_generated = max_tokens;
        j->generated = malloc(max_tokens * sizeof *j->generated);
        if (!j->generated) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    if (st == CORRAL_OK && j->req->generate->session[0]) st = session_attach(s, j, err);

    sched_session *ss = j->session;
    if (st == CORRAL_OK && (!ss || !ss->kv)) {
        /* A new cache: the session's whole context, or just enough for this request. */
        uint32_t positions = sm->context;
        if (!ss && j->n_prompt + max_tokens < positions) positions = j->n_prompt + max_tokens;
        st = make_room(s, kv_bytes_for(sm, positions), sm, err);
        if (st == CORRAL_RESOURCE_EXHAUSTED) {
            *wait = true;
        } else if (st == CORRAL_OK) {
            kv_cache *kv = model_kv_new(sm, positions, err);
            if (!kv)
                st = err->status;
            else if (ss)
                ss->kv = kv;
            else
                j->kv = kv;
            if (kv && ss && ss->swapped) session_swap_in(s, ss);
        }
    }
    if (st == CORRAL_OK && ss) {
        /* Reuse the longest prefix the cache already holds; the last prompt token always runs
         * again so that its logits are fresh. */
        uint32_t common = 0;
        while (common < ss->n_tokens && common < j->n_prompt &&
               ss->tokens[common] == j->prompt[common])
            common++;
        if (common >= j->n_prompt) common = j->n_prompt - 1;
        kv_cache_truncate(ss->kv, common);
        ss->n_tokens = common;
        ss->busy = j;
        j->kv = ss->kv;
        j->n_cached = common;
        j->n_prefilled = common;
    }
    if (st == CORRAL_OK) {
        /* The output restrictions: the request's regex and the profile's generation hooks. */
        const char *regex = j->req->generate->constraint;
        j->pg = policy_gen_new(profile, sm->pv, regex, strlen(regex), err);
        if (!j->pg)
            st = err->status;
        else
            gp.processor = policy_gen_processor(j->pg);
    }
    if (st == CORRAL_OK) {
        j->gen = gen_new(sm->m, sm->runner, j->kv, &gp, err);
        if (!j->gen) st = err->status;
    }
    mem_scope_leave(scope);
    if (st != CORRAL_OK) {
        /* Keep nothing: the job either fails or tries again from scratch. */
        policy_gen_destroy(&j->pg);
        if (j->kv && !j->session) model_kv_free(sm, &j->kv);
        j->kv = NULL;
        if (j->session && j->session->busy == j) j->session->busy = NULL;
        j->session = NULL;
        free(j->prompt);
        free(j->generated);
        j->prompt = j->generated = NULL;
        j->n_prompt = j->cap_generated = 0;
        j->n_cached = j->n_prefilled = 0;
        return st;
    }
    j->started = true;
    j->started_us = mono_us();
    sm->last_used_ms = unix_ms();
    return CORRAL_OK;
}

/* ---- one step -----------------------------------------------------------------------------------
 */

static void append_text(job *j, const char *text, size_t len) {
    if (j->text_len + len + 1 > j->text_cap) {
        size_t cap = j->text_cap ? j->text_cap * 2 : 256;
        while (cap < j->text_len + len + 1) cap *= 2;
        char *grown = realloc(j->text, cap);
        if (!grown) return; /* the Done still comes; the text is cut */
        j->text = grown;
        j->text_cap = cap;
    }
    memcpy(j->text + j->text_len, text, len);
    j->text_len += len;
}

static Corral__V1__StopReason stop_reason_of(gen_stop stop) {
    return (Corral__V1__StopReason)stop; /* the numbers agree by design (corral.proto) */
}

/* Step a job whose model is resident and which holds its cache: bound to the model's arena. */
static void job_step_started(sched *s, job *j);

static void job_step(sched *s, job *j) {
    corral_error err = {0};
    if (!j->started) {
        bool wait;
        if (job_start(s, j, &wait, &err) != CORRAL_OK) {
            if (!wait) {
                finish_error(s, j, err.status, "%s", err.message);
                return;
            }
            /* No room now: give the active slot back and try again a little later, until the
             * deadline (or limits.memory_wait_ms) runs out. */
            const int64_t now = mono_us();
            if (!j->memory_wait_until_us)
                j->memory_wait_until_us = j->deadline_us
                                              ? j->deadline_us
                                              : j->received_us + s->config->memory_wait_ms * 1000LL;
            j->retry_at_us = now + MEMORY_RETRY_US;
            /* Keep the message (it is the eventual error), cut to the job's buffer. */
            const size_t len = strnlen(err.message, sizeof j->wait_reason - 1);
            memcpy(j->wait_reason, err.message, len);
            j->wait_reason[len] = '\0';
            if (j->active) {
                j->active = false;
                j->model->n_active--;
            }
            return;
        }
    }
    const unsigned scope = mem_scope_enter(j->model->owner);
    job_step_started(s, j);
    mem_scope_leave(scope);
}

static void job_step_started(sched *s, job *j) {
    corral_error err = {0};
    j->model->last_used_ms = unix_ms();
    if (j->n_prefilled < j->n_prompt) {
        uint32_t n = j->n_prompt - j->n_prefilled;
        if (n > (uint32_t)s->config->prefill_chunk) n = (uint32_t)s->config->prefill_chunk;
        const int64_t t0 = mono_us();
        if (gen_prefill(j->gen, j->prompt + j->n_prefilled, n, &err) != CORRAL_OK) {
            finish_error(s, j, err.status, "%s", err.message);
            return;
        }
        j->prefill_us += mono_us() - t0;
        j->n_prefilled += n;
        if (j->n_prompt - j->n_cached > (uint32_t)s->config->prefill_chunk) {
            Corral__V1__Progress p = CORRAL__V1__PROGRESS__INIT;
            p.prefilled_tokens = j->n_prefilled;
            p.total_tokens = j->n_prompt;
            Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
            r.body_case = CORRAL__V1__RESPONSE__BODY_PROGRESS;
            r.progress = &p;
            emit(s, j, &r, false);
        }
        return;
    }
    const int64_t t0 = mono_us();
    gen_token t;
    if (gen_next(j->gen, &t, &err) != CORRAL_OK) {
        finish_error(s, j, err.status, "%s", err.message);
        return;
    }
    j->decode_us += mono_us() - t0;
    if (t.id >= 0 && j->n_generated < j->cap_generated) j->generated[j->n_generated++] = t.id;
    if (j->req->generate->stream) {
        if (t.len > 0 || t.id >= 0) {
            Corral__V1__Chunk c = CORRAL__V1__CHUNK__INIT;
            char *text = malloc(t.len + 1);
            if (text) {
                memcpy(text, t.text, t.len);
                text[t.len] = '\0';
            }
            c.text = text ? text : (char *)"";
            int32_t id = t.id;
            c.n_token_ids = t.id >= 0 ? 1 : 0;
            c.token_ids = &id;
            c.index = j->chunk_index++;
            Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
            r.body_case = CORRAL__V1__RESPONSE__BODY_CHUNK;
            r.chunk = &c;
            emit(s, j, &r, false);
            free(text);
        }
    } else {
        append_text(j, t.text, t.len);
    }
    if (t.stop != GEN_STOP_NONE) finish_done(s, j, stop_reason_of(t.stop));
}

/* ---- quick requests -----------------------------------------------------------------------------
 */

/* The adapters of a variant as protocol messages, in one allocation freed with free(): the
 * pointer array first, then the messages. *n gets their count; NULL when there are none (or no
 * memory: the listing then omits them). */
static Corral__V1__AdapterInfo **adapter_infos(const cfg_model *mc, size_t *n) {
    *n = 0;
    if (!mc->n_adapters) return NULL;
    Corral__V1__AdapterInfo **ptrs =
        malloc(mc->n_adapters * (sizeof *ptrs + sizeof(Corral__V1__AdapterInfo)));
    if (!ptrs) return NULL;
    Corral__V1__AdapterInfo *items = (Corral__V1__AdapterInfo *)(ptrs + mc->n_adapters);
    for (size_t i = 0; i < mc->n_adapters; i++) {
        corral__v1__adapter_info__init(&items[i]);
        items[i].path = mc->adapters[i].path;
        items[i].scale = mc->adapters[i].scale;
        ptrs[i] = &items[i];
    }
    *n = mc->n_adapters;
    return ptrs;
}

static void fill_model_status(sched_model *sm, Corral__V1__ModelStatus *ms) {
    corral__v1__model_status__init(ms);
    ms->name = sm->name;
    ms->state = (Corral__V1__ModelState)sm->state;
    ms->bytes = model_bytes(sm);
    ms->preload = sm->cfg->preload;
    ms->ttl_ms = (uint64_t)sm->cfg->ttl_ms;
    ms->last_used_ms = (uint64_t)sm->last_used_ms;
    ms->queue_depth = sm->n_queued - sm->n_active;
    ms->active = sm->n_active;
    ms->requests_served = sm->served;
    ms->pinned = sm->pinned;
    ms->sessions = sm->n_sessions;
    ms->swap_ins = sm->swap_ins;
    ms->swap_outs = sm->swap_outs;
    ms->merges = sm->merges;
    ms->last_load_ms = (uint64_t)(sm->load_us / 1000);
    ms->loads = sm->loads;
    if (sm->cfg->n_adapters) ms->base_path = sm->cfg->path;
    ms->adapters = adapter_infos(sm->cfg, &ms->n_adapters);
}

static void answer_status(sched *s, job *j) {
    const char *want = j->req->status->model;
    size_t n = 0;
    for (sched_model *sm = s->models; sm; sm = sm->next)
        if (!sm->removed && (!want[0] || strcmp(want, sm->name) == 0)) n++;
    if (want[0] && n == 0) {
        emit_error(s, j, CORRAL_NOT_FOUND, "model '%s' is not configured", want);
        return;
    }
    Corral__V1__ModelStatus *items = calloc(n ? n : 1, sizeof *items);
    Corral__V1__ModelStatus **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (!items || !ptrs) {
        free(items);
        free(ptrs);
        emit_error(s, j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    size_t k = 0;
    uint64_t total = 0;
    uint32_t active = 0, queued = 0;
    for (sched_model *sm = s->models; sm; sm = sm->next) {
        if (sm->removed) continue;
        total += model_bytes(sm);
        active += sm->n_active;
        queued += sm->n_queued - sm->n_active;
        if (want[0] && strcmp(want, sm->name) != 0) continue;
        fill_model_status(sm, &items[k]);
        ptrs[k] = &items[k];
        k++;
    }
    Corral__V1__DaemonStatus d = CORRAL__V1__DAEMON_STATUS__INIT;
    d.version = CORRAL_VERSION;
    d.uptime_ms = (uint64_t)(unix_ms() - s->started_ms);
    d.total_bytes = total;
    d.limit_bytes = s->config->memory_limit;
    d.active = active;
    d.queued = queued;
    d.requests_served = s->served;
    d.sessions = (uint32_t)session_count(s);
    d.threads = threadpool_n_threads(s->pool);
    Corral__V1__StatusReply reply = CORRAL__V1__STATUS_REPLY__INIT;
    reply.n_models = k;
    reply.models = ptrs;
    reply.daemon = &d;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_STATUS;
    r.status = &reply;
    emit(s, j, &r, true);
    for (size_t i = 0; i < k; i++) free(items[i].adapters);
    free(items);
    free(ptrs);
}

static void answer_list(sched *s, job *j) {
    size_t n = 0;
    for (sched_model *sm = s->models; sm; sm = sm->next) n += !sm->removed;
    Corral__V1__ModelInfo *items = calloc(n ? n : 1, sizeof *items);
    Corral__V1__ModelInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (!items || !ptrs) {
        free(items);
        free(ptrs);
        emit_error(s, j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    size_t k = 0;
    for (sched_model *sm = s->models; sm; sm = sm->next) {
        if (sm->removed) continue;
        Corral__V1__ModelInfo *mi = &items[k];
        corral__v1__model_info__init(mi);
        mi->name = sm->name;
        mi->path = sm->cfg->path;
        mi->arch = sm->m ? (char *)model_get_hparams(sm->m)->arch : (char *)"";
        mi->context = sm->state == MODEL_RESIDENT ? sm->context : (uint32_t)sm->cfg->context;
        const char *tn =
            sm->state == MODEL_RESIDENT ? chat_template_name(sm->tmpl) : sm->cfg->chat_template;
        mi->chat_template = (char *)(tn ? tn : "");
        mi->state = (Corral__V1__ModelState)sm->state;
        mi->pinned = sm->pinned;
        mi->adapters = adapter_infos(sm->cfg, &mi->n_adapters);
        ptrs[k++] = mi;
    }
    Corral__V1__ModelList list = CORRAL__V1__MODEL_LIST__INIT;
    list.n_models = k;
    list.models = ptrs;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_MODELS;
    r.models = &list;
    emit(s, j, &r, true);
    for (size_t i = 0; i < k; i++) free(items[i].adapters);
    free(items);
    free(ptrs);
}

/* The model a request names, checked against the config and the app's rights. */
static sched_model *resolve_model(sched *s, job *j, const char *name) {
    sched_model *sm = name[0] ? model_find(s, name) : NULL;
    if (!sm || sm->removed) {
        emit_error(s, j, CORRAL_NOT_FOUND, "model '%s' is not configured", name);
        return NULL;
    }
    const cfg_app *app = cfg_find_app(s->config, j->app);
    if (!cfg_app_allows_model(app, sm->name)) {
        emit_error(s, j, CORRAL_PERMISSION_DENIED, "app '%s' may not use model '%s'", j->app,
                   sm->name);
        return NULL;
    }
    return sm;
}

static void answer_tokenize(sched *s, job *j) {
    const Corral__V1__Tokenize *t = j->req->tokenize;
    sched_model *sm = resolve_model(s, j, t->model);
    if (!sm) return;
    corral_error err;
    if (model_ensure_loaded(s, sm, NULL, &err) != CORRAL_OK) {
        emit_error(s, j, err.status, "%s", err.message);
        return;
    }
    const tokenizer *tok = model_get_tokenizer(sm->m);
    size_t n = 0;
    const uint32_t flags = t->add_special ? TOK_ADD_SPECIAL : 0;
    int32_t *ids = NULL;
    corral_status st = tok_encode(tok, t->text, strlen(t->text), flags, NULL, 0, &n, &err);
    if (st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED) {
        ids = malloc((n ? n : 1) * sizeof *ids);
        st = ids ? tok_encode(tok, t->text, strlen(t->text), flags, ids, n, &n, &err)
                 : corral_error_set(&err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    char **pieces = st == CORRAL_OK ? calloc(n ? n : 1, sizeof *pieces) : NULL;
    if (st == CORRAL_OK && !pieces)
        st = corral_error_set(&err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; st == CORRAL_OK && i < n; i++) {
        size_t len;
        const char *p = tok_token_text(tok, ids[i], &len);
        pieces[i] = malloc(len + 1);
        if (!pieces[i]) {
            st = corral_error_set(&err, CORRAL_OUT_OF_MEMORY, "out of memory");
            break;
        }
        memcpy(pieces[i], p, len);
        pieces[i][len] = '\0';
    }
    if (st == CORRAL_OK) {
        Corral__V1__TokenizeReply reply = CORRAL__V1__TOKENIZE_REPLY__INIT;
        reply.n_ids = n;
        reply.ids = ids;
        reply.n_pieces = n;
        reply.pieces = pieces;
        Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
        r.body_case = CORRAL__V1__RESPONSE__BODY_TOKENIZE;
        r.tokenize = &reply;
        emit(s, j, &r, true);
    } else {
        emit_error(s, j, err.status, "%s", err.message);
    }
    for (size_t i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
    free(ids);
}

static void answer_admin(sched *s, job *j) {
    const char *name = "";
    switch (j->req->body_case) {
        case CORRAL__V1__REQUEST__BODY_LOAD:
            name = j->req->load->model;
            break;
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
            name = j->req->unload->model;
            break;
        case CORRAL__V1__REQUEST__BODY_PIN:
            name = j->req->pin->model;
            break;
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            name = j->req->unpin->model;
            break;
        default:
            break;
    }
    sched_model *sm = resolve_model(s, j, name);
    if (!sm) return;
    char message[256];
    corral_error err;
    switch (j->req->body_case) {
        case CORRAL__V1__REQUEST__BODY_LOAD: {
            int64_t us = 0;
            if (model_ensure_loaded(s, sm, &us, &err) != CORRAL_OK) {
                emit_error(s, j, err.status, "%s", err.message);
                return;
            }
            snprintf(message, sizeof message, "model '%s' is resident", sm->name);
            break;
        }
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
            if (model_busy(s, sm)) {
                emit_error(s, j, CORRAL_FAILED_PRECONDITION,
                           "model '%s' has requests in flight; try again when they finish",
                           sm->name);
                return;
            }
            model_release(s, sm, MODEL_UNLOADED);
            snprintf(message, sizeof message, "model '%s' unloaded", sm->name);
            break;
        case CORRAL__V1__REQUEST__BODY_PIN:
            sm->pinned = true;
            snprintf(message, sizeof message, "model '%s' pinned", sm->name);
            break;
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            sm->pinned = false;
            snprintf(message, sizeof message, "model '%s' unpinned", sm->name);
            break;
        default:
            return;
    }
    emit_ack(s, j, message);
}

/* A new Generate: check what can be checked now, count it, queue it. */
static void admit_generate(sched *s, job *j) {
    const Corral__V1__Generate *g = j->req->generate;
    if (s->shutdown) {
        emit_error(s, j, CORRAL_UNAVAILABLE, "corrald is shutting down");
        return;
    }
    if ((g->prompt[0] != '\0') == (g->n_messages > 0)) {
        emit_error(s, j, CORRAL_INVALID_ARGUMENT,
                   "give exactly one of prompt and messages (got %s)",
                   g->n_messages ? "both" : "neither");
        return;
    }
    for (size_t i = 0; i < g->n_messages; i++) {
        const char *role = g->messages[i]->role;
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            emit_error(s, j, CORRAL_INVALID_ARGUMENT,
                       "message %zu has role '%s'; roles are system, user and assistant", i, role);
            return;
        }
    }
    if (g->sanitizer[0] && !profile_find(s, g->sanitizer)) {
        emit_error(s, j, CORRAL_NOT_FOUND, "sanitizer profile '%s' is not configured",
                   g->sanitizer);
        return;
    }
    sched_model *sm = resolve_model(s, j, g->model);
    if (!sm) return;
    if (g->priority > CORRAL__V1__PRIORITY__PRIORITY_REALTIME) {
        emit_error(s, j, CORRAL_INVALID_ARGUMENT, "unknown priority %d", (int)g->priority);
        return;
    }
    cfg_priority prio = g->priority ? (cfg_priority)g->priority : sm->cfg->priority;
    const cfg_app *app = cfg_find_app(s->config, j->app);
    cfg_priority ceiling = app ? app->max_priority : CFG_PRIORITY_INTERACTIVE;
    if (prio > ceiling) prio = ceiling;
    j->priority = prio;
    if (sm->n_queued >= (uint32_t)s->config->queue_per_model) {
        emit_error(s, j, CORRAL_RESOURCE_EXHAUSTED,
                   "model '%s' has %u requests queued (limits.queue_per_model)", sm->name,
                   sm->n_queued);
        return;
    }
    app_count *ac = app_counter(s, j->app);
    if (ac && ac->n >= (uint32_t)s->config->queue_per_app) {
        emit_error(s, j, CORRAL_RESOURCE_EXHAUSTED,
                   "app '%s' has %u requests queued (limits.queue_per_app)",
                   j->app[0] ? j->app : "(default)", ac->n);
        return;
    }
    j->model = sm;
    sm->n_queued++;
    if (ac) ac->n++;
    j->counted = true;
    j->next = NULL;
    job **pp = &s->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = j;
}

static void dispatch(sched *s, job *j) {
    switch (j->req->body_case) {
        case CORRAL__V1__REQUEST__BODY_GENERATE:
            admit_generate(s, j);
            break;
        case CORRAL__V1__REQUEST__BODY_STATUS:
            answer_status(s, j);
            break;
        case CORRAL__V1__REQUEST__BODY_LIST_MODELS:
            answer_list(s, j);
            break;
        case CORRAL__V1__REQUEST__BODY_TOKENIZE:
            answer_tokenize(s, j);
            break;
        case CORRAL__V1__REQUEST__BODY_LOAD:
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
        case CORRAL__V1__REQUEST__BODY_PIN:
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            answer_admin(s, j);
            break;
        default:
            emit_error(s, j, CORRAL_INTERNAL, "the scheduler cannot handle this request");
            break;
    }
}

/* ---- choosing the next step -------------------------------------------------------------------
 */

/* End jobs that were cancelled or ran out of time. */
static void reap(sched *s) {
    const int64_t now = mono_us();
    for (job *j = s->jobs, *next; j; j = next) {
        next = j->next;
        const int why = atomic_load(&j->cancel);
        if (why != JOB_CANCEL_NONE) {
            if (why == JOB_CANCEL_SHUTDOWN || !j->started) {
                finish_error(s, j,
                             why == JOB_CANCEL_SHUTDOWN ? CORRAL_UNAVAILABLE : CORRAL_CANCELLED,
                             why == JOB_CANCEL_SHUTDOWN  ? "corrald is shutting down"
                             : why == JOB_CANCEL_STALLED ? "the client stopped reading its stream"
                                                         : "cancelled before it started");
            } else {
                gen_token t;
                gen_finish(j->gen, GEN_STOP_NONE, &t);
                if (t.len && !j->req->generate->stream) append_text(j, t.text, t.len);
                finish_done(s, j, CORRAL__V1__STOP_REASON__STOP_REASON_CANCELLED);
            }
        } else if (!j->started && j->memory_wait_until_us && now > j->memory_wait_until_us) {
            finish_error(s, j, CORRAL_RESOURCE_EXHAUSTED, "%s", j->wait_reason);
        } else if (j->deadline_us && now > j->deadline_us) {
            finish_error(s, j, CORRAL_DEADLINE_EXCEEDED,
                         "deadline of %u ms passed while the request was %s",
                         j->req->generate->deadline_ms,
                         !j->started                    ? "queued"
                         : j->n_prefilled < j->n_prompt ? "reading the prompt"
                                                        : "generating");
        }
    }
}

/* Whether j can take a step now. */
static bool runnable(sched *s, job *j) {
    if (atomic_load(&j->paused)) return false;
    if (j->started) return true;
    if (j->retry_at_us && mono_us() < j->retry_at_us) return false;
    sched_model *sm = j->model;
    if (sm->reload_pending && model_busy(s, sm)) return false;
    /* A session is used by one request at a time. */
    const char *sid = j->req->generate->session;
    if (sid[0])
        for (sched_session *ss = s->sessions; ss; ss = ss->next)
            if (strcmp(ss->id, sid) == 0 && ss->busy && ss->busy != j) return false;
    /* Realtime requests always start; others wait for an active slot. */
    return j->priority == CFG_PRIORITY_REALTIME ||
           sm->n_active < (uint32_t)s->config->active_per_model;
}

/* The first runnable job of the highest class in the list. Stepped jobs move to the end of the
 * list, so the first of a class is the one that waited longest: equal jobs take turns. */
static job *pick(sched *s) {
    job *best = NULL;
    for (job *j = s->jobs; j; j = j->next) {
        if (!runnable(s, j)) continue;
        if (!best || j->priority > best->priority) best = j;
    }
    return best;
}

/* ---- the thread
 * ----------------------------------------------------------------------------------- */

static void *sched_main(void *arg) {
    sched *s = arg;
    mem_thread_init();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *inbox = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        cfg *reload = s->pending_cfg;
        s->pending_cfg = NULL;
        const bool quit = s->quit;
        const bool shutdown = s->shutdown;
        s->poked = false;
        pthread_mutex_unlock(&s->mu);
        if (quit) break;

        if (reload) {
            cfg_keep *keep = malloc(sizeof *keep);
            profile_set profiles;
            corral_error perr;
            if (keep && profiles_build(reload, &profiles, &perr) != CORRAL_OK) {
                log_error("configuration not reloaded: a sanitizer cannot be built",
                          LOG_STR("error", perr.message));
                free(keep);
                keep = NULL;
                cfg_destroy(&reload);
            }
            if (keep) {
                /* Running jobs may still use the old entries and profiles: keep them. */
                keep->c = s->config;
                keep->profiles = s->profiles;
                keep->next = s->old_configs;
                s->old_configs = keep;
                s->profiles = profiles;
                s->config = reload;
                s->policy = evict_policy_find(reload->evict_policy);
                models_sync(s, reload);
                log_info("configuration reloaded", LOG_UINT("models", reload->n_models));
            } else {
                cfg_destroy(&reload);
            }
        }
        for (job *j = inbox, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            dispatch(s, j);
        }
        if (shutdown)
            for (job *j = s->jobs; j; j = j->next) atomic_store(&j->cancel, JOB_CANCEL_SHUTDOWN);
        reap(s);
        sessions_expire(s);
        const int64_t now_ms = unix_ms();
        for (sched_model *sm = s->models; sm; sm = sm->next) {
            /* A swapped-out model past its keep-alive gives back what it kept, too. */
            if (model_kept(sm) && sm->cfg->ttl_ms && !sm->pinned &&
                now_ms - sm->last_used_ms > sm->cfg->ttl_ms)
                model_drop(sm);
            if (sm->state != MODEL_RESIDENT || model_busy(s, sm)) continue;
            /* Gone from the config or changed: unload now that it is idle. */
            if (sm->removed || sm->reload_pending) model_release(s, sm, MODEL_UNLOADED);
            /* Keep-alive ran out: give the memory back to the machine. */
            else if (sm->cfg->ttl_ms && !sm->pinned && now_ms - sm->last_used_ms > sm->cfg->ttl_ms)
                model_release(s, sm, MODEL_UNLOADED);
        }

        job *j = pick(s);
        if (j) {
            /* Round robin within the class: step it, then move it behind its equals. */
            if (!j->active && !j->started) {
                j->active = true;
                j->model->n_active++;
            }
            job_step(s, j);
            bool still_here = false;
            for (job *k = s->jobs; k; k = k->next) still_here |= k == j;
            if (still_here) {
                for (job **pp = &s->jobs; *pp; pp = &(*pp)->next)
                    if (*pp == j) {
                        *pp = j->next;
                        break;
                    }
                j->next = NULL;
                job **pp = &s->jobs;
                while (*pp) pp = &(*pp)->next;
                *pp = j;
            }
            continue;
        }

        pthread_mutex_lock(&s->mu);
        s->idle = s->jobs == NULL && s->inbox_head == NULL;
        if (!s->inbox_head && !s->poked && !s->quit && !s->pending_cfg &&
            !(s->shutdown && s->jobs)) {
            /* Nothing can run: sleep until new work, a poke, or a periodic check (deadlines,
             * session expiry, paused streams). */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            const long wait_ns = s->jobs ? 5000000L : 200000000L;
            until.tv_nsec += wait_ns;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &until);
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- public -------------------------------------------------------------------------------------
 */

corral_status sched_check_profiles(const cfg *c, corral_error *err) {
    profile_set ps;
    corral_status st = profiles_build(c, &ps, err);
    if (st == CORRAL_OK) profiles_free(&ps);
    return st;
}

sched *sched_new(cfg *c, int notify_fd, corral_error *err) {
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_destroy(&c);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->notify_fd = notify_fd;
    s->config = c;
    s->started_ms = unix_ms();
    s->policy = evict_policy_find(c->evict_policy);
    mem_thread_init(); /* preloads below allocate for models from this thread */
    swap_scan_report scan;
    s->swap = swap_dir_open(c->swap_dir, c->session_ttl_ms, &scan);
    if (!s->swap) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        sched_destroy(&s);
        return NULL;
    }
    log_info("memory", LOG_F64("limit_mib", c->memory_limit / 1048576.0),
             LOG_F64("high_watermark", c->high_watermark),
             LOG_F64("low_watermark", c->low_watermark), LOG_STR("policy", s->policy->name),
             LOG_STR("swap_dir", c->swap_dir), LOG_INT("swap_writable", swap_dir_writable(s->swap)),
             LOG_INT("exact_accounting", mem_accounting_exact()),
             LOG_UINT("temp_removed", scan.temp_removed), LOG_UINT("images_kept", scan.images_kept),
             LOG_UINT("images_removed", scan.images_removed));
    s->pool = threadpool_new((uint32_t)c->threads, err);
    if (!s->pool || profiles_build(c, &s->profiles, err) != CORRAL_OK) {
        sched_destroy(&s);
        return NULL;
    }
    models_sync(s, c);
    for (sched_model *sm = s->models; sm; sm = sm->next) {
        if (!sm->cfg->preload) continue;
        if (model_ensure_loaded(s, sm, NULL, err) != CORRAL_OK) {
            sched_destroy(&s);
            return NULL;
        }
    }
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot start the scheduler thread");
        sched_destroy(&s);
        return NULL;
    }
    s->thread_started = true;
    return s;
}

void sched_submit(sched *s, job *j) {
    j->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->inbox_tail)
        s->inbox_tail->next = j;
    else
        s->inbox_head = j;
    s->inbox_tail = j;
    s->idle = false;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_poke(sched *s) {
    pthread_mutex_lock(&s->mu);
    s->poked = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

outmsg *sched_take_outbox(sched *s) {
    pthread_mutex_lock(&s->mu);
    outmsg *head = s->out_head;
    s->out_head = s->out_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return head;
}

void sched_reload(sched *s, cfg *c) {
    pthread_mutex_lock(&s->mu);
    if (s->pending_cfg) cfg_destroy(&s->pending_cfg);
    s->pending_cfg = c;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_shutdown(sched *s) {
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int sched_idle(sched *s) {
    pthread_mutex_lock(&s->mu);
    int idle = s->idle && !s->inbox_head;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void sched_destroy(sched **ps) {
    if (!ps || !*ps) return;
    sched *s = *ps;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* Jobs still held (the server gave up waiting at shutdown): release what the scheduler owns
     * for them; the jobs themselves belong to the server's table of requests in flight. */
    while (s->jobs) job_release(s, s->jobs);
    for (outmsg *m = s->out_head, *next; m; m = next) {
        next = m->next;
        free(m->data);
        free(m);
    }
    /* Conversations survive a restart: their caches go to the swap directory, whose images the
     * next corrald picks up when the sessions continue. */
    while (s->sessions) {
        sched_session *ss = s->sessions;
        s->sessions = ss->next;
        if (ss->model) {
            session_swap_out(s, ss);
            ss->model->n_sessions--;
        }
        free(ss->tokens);
        free(ss);
    }
    for (sched_model *sm = s->models, *next; sm; sm = next) {
        next = sm->next;
        model_release(s, sm, MODEL_UNLOADED);
        free(sm->weights_path);
        free(sm->name);
        free(sm);
    }
    swap_dir_destroy(&s->swap);
    threadpool_destroy(&s->pool);
    for (app_count *a = s->apps, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    for (cfg_keep *k = s->old_configs, *next; k; k = next) {
        next = k->next;
        profiles_free(&k->profiles);
        cfg_destroy(&k->c);
        free(k);
    }
    profiles_free(&s->profiles);
    cfg_destroy(&s->pending_cfg);
    cfg_destroy(&s->config);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    *ps = NULL;
}

void job_free(job *j) {
    if (!j) return;
    if (j->req) corral__v1__request__free_unpacked(j->req, NULL);
    gen_destroy(&j->gen);
    policy_gen_destroy(&j->pg);
    free(j->sanitizer_report);
    free(j->prompt);
    free(j->generated);
    free(j->text);
    free(j);
}
