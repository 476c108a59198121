/*
 * residency.c — the models the core serves: loading them (merging a variant's adapters first),
 * swapping their weights out and back in, unloading them, and listing what holds memory for the
 * budget (budget.c decides; this file carries the evictions out).
 *
 * A model's states (core_model_state): UNLOADED (nothing in memory), LOADING (a load or swap-in is
 * running), RESIDENT (ready), SWAPPED (its weights unmapped to make room; what is small but slow
 * to rebuild — tokenizer, runner scratch, policy vocabulary — is kept, so a swap-in only maps the
 * weights again), BROKEN (its file failed under it; see below). Each model is a memory owner
 * (mem.h): its weights' mapping plus a jemalloc arena holding its runner, its policy vocabulary
 * and the KV caches of its requests and sessions.
 *
 * Files that change under a running daemon (docs/robustness.md). The weights are mapped, so what
 * a model serves is whatever its file holds at the moment a page is read. Before a job starts on
 * a resident model, the model's file is compared with its stamp at load (stat: no reading), and a
 * variant's base and adapter files with theirs: a file changed in place (rewritten, truncated,
 * touched) breaks the model — the requests it serves read weights that are no longer the ones they
 * began with —; a file replaced at its path (the old one, still mapped, is intact), or a variant's
 * inputs changed (its merged image is stale), reloads it once its requests end. A read that faults
 * (SIGBUS: the file got shorter than its mapping, or a disk error) breaks it too: the compute
 * thread, the preparer and the loader each guard the work that reads mappings (fault.h). A broken
 * model's requests past waiting end with an Error naming the file and what happened, its sessions'
 * caches are dropped (they are recomputed from the conversation's text), its parts go once no job
 * holds them, and the next request loads the file afresh: a truncated file is then refused by the
 * GGUF reader, by name, and a rewritten one serves its new weights (the caches of rearranged and
 * merged weights are keyed by the file's fingerprint, so no stale image is used).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "corral/fault.h"
#include "corral/image.h"
#include "corral/log.h"
#include "corral/prompt.h"
#include "lora.h"
#include "sched_impl.h"

/* Heap a model needs beyond its file mapping, reserved before loading it (scratch, tokenizer
 * tables): MODEL_HEAP_RESERVE plus a 64th of the file. The accounting then measures the real
 * figure, and the budget is rebalanced right after the load if the guess was short. */
#define MODEL_HEAP_RESERVE       (8ull << 20)
/* A swap-in maps the weights again under the heap the model kept, and takes some heap of its own
 * (the mapped image's tables: 720 KB for a 13 MB model in the soak test). It reserves its file
 * plus the most any of its swap-ins took, or this before the first one. Reserving the file alone
 * let the models' total pass memory.limit after a swap-in when nothing else could be evicted. */
#define MODEL_RESTORE_HEAP_GUESS (1ull << 20)
/* What the daemon keeps in cache.dir, under one budget (cache.limit). */
#define CACHE_FILE_PREFIXES \
    LORA_CACHE_FILE_PREFIX "|" LORA_QUANT_CACHE_FILE_PREFIX "|" MODEL_REPACK_FILE_PREFIX

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
    for (const sched_model *sm = k->models; sm; sm = sm->next) {
        uint64_t bytes = residency_model_bytes(sm);
        /* A load in flight counts what it reserved until its own bytes overtake it. */
        if (sm->loading && sm->reserved_base + sm->reserved > bytes)
            bytes = sm->reserved_base + sm->reserved;
        total += bytes;
    }
    return total;
}

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* What a KV cache takes besides its K and V buffers (kv_cache_new: the struct). */
#define RESIDENCY_KV_OVERHEAD 256

/* The budget plans a KV cache at what the allocator will really take: its K and V buffers
 * rounded up to their size classes. Planned at the requested size, a cache of 414 positions took
 * 139 KB more than planned, and the models' total passed memory.limit. */
uint64_t residency_kv_bytes(const sched_model *sm, uint32_t n_ctx) {
    /* The engine's count: a sliding-window layer keeps its window, not the context, and heads may
     * be wider than n_embd / n_head. Its K and V buffers are half each. */
    const uint64_t bytes =
        kv_cache_bytes_for(sm->m, n_ctx, sm->cfg->kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16);
    return 2 * mem_allocation_size(bytes / 2) + RESIDENCY_KV_OVERHEAD;
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

/* Bytes of sm's sessions' caches in memory (being written out included). */
static uint64_t sessions_bytes(const struct core *k, const sched_model *sm) {
    uint64_t n = 0;
    for (const sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->kv) n += kv_cache_bytes(ss->kv);
    return n;
}

static void sources_free(residency_source **sources, size_t *n) {
    for (size_t i = 0; *sources && i < *n; i++) free((*sources)[i].path);
    free(*sources);
    *sources = NULL;
    *n = 0;
}

void residency_drop(sched_model *sm) {
    batch_free(sm);
    model_runner_destroy(&sm->runner);
    policy_vocab_destroy(&sm->pv);
    model_destroy(&sm->m);
    mem_owner_destroy(&sm->owner);
    sources_free(&sm->sources, &sm->n_sources);
    sm->stale = false;
}

/* ---- broken models --------------------------------------------------------------------------- */

void residency_break(struct core *k, sched_model *sm, const char *why) {
    (void)k;
    if (sm->broken) return;
    sm->broken = true;
    snprintf(sm->broken_reason, sizeof sm->broken_reason, "%s", why);
    sm->state = CORE_MODEL_BROKEN;
    sm->reload_pending = false;
    log_warn("model broken: its requests in flight fail, the next one loads it afresh",
             LOG_STR("model", sm->name), LOG_STR("reason", why));
}

/* A broken model's parts, once no job holds them: its sessions' caches are dropped (computed on
 * weights that failed, they are not written out), then the model, runner and arena go. False
 * while a session's cache is still being written or read (it is tried again at the next tick). */
static bool drop_broken_parts(struct core *k, sched_model *sm) {
    for (const sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->io) return false;
    for (sched_session *ss = k->sessions; ss; ss = ss->next) {
        if (ss->model != sm || !ss->kv) continue;
        log_warn("session state dropped: its model broke; the conversation is recomputed",
                 LOG_STR("session", ss->id), LOG_STR("model", sm->name));
        residency_kv_free(sm, &ss->kv);
        ss->n_tokens = 0;
    }
    residency_drop(sm);
    return true;
}

void residency_swap_out(struct core *k, sched_model *sm) {
    (void)k;
    model_weights_release(sm->m);
    mem_owner_set_mapped(sm->owner, 0);
    sm->state = CORE_MODEL_SWAPPED;
    sm->was_swapped = true;
    sm->swap_outs++;
    log_info("model swapped out", LOG_STR("model", sm->name));
}

/* Unload sm now if none of its sessions' caches is in memory (they live in its arena); otherwise
 * start writing them out and leave the rest to residency_tick. True when it was unloaded. Stale
 * kept parts go the same way, but the model stays swapped out (its next load is a swap-in). */
static bool unload_when_possible(struct core *k, sched_model *sm) {
    if (session_any_in_memory(k, sm)) {
        for (sched_session *ss = k->sessions; ss; ss = ss->next)
            if (ss->model == sm && ss->kv && !ss->io && !ss->busy) session_start_swap_out(k, ss);
        return false;
    }
    const bool stale = sm->stale;
    if (!stale && (sm->state == CORE_MODEL_RESIDENT || residency_kept(sm)))
        log_info("model unloaded", LOG_STR("model", sm->name));
    residency_drop(sm);
    if (!stale) {
        sm->state = CORE_MODEL_UNLOADED;
        sm->was_swapped = false;
    }
    sm->reload_pending = false;
    sm->unload_requested = false;
    return true;
}

/* ---- the budget's holders -------------------------------------------------------------------- */

/* Every holder of memory the budget may consider, with what evicting it frees. `protect` is in
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
                                        .flags = BUDGET_ASYNC | (ss->busy ? BUDGET_IN_USE : 0) |
                                                 (ss->io ? BUDGET_LEAVING : 0)};
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
                                                 (in_use ? BUDGET_IN_USE : 0) |
                                                 (sm == protect ? BUDGET_TARGET : 0)};
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

budget_verdict residency_make_room(struct core *k, uint64_t need, const sched_model *protect,
                                   corral_error *err) {
    const cfg *c = core_cfg(k);
    const budget_params p = {.limit = c->memory_limit,
                             .high = c->high_watermark,
                             .low = c->low_watermark,
                             .policy = evict_policy_find(c->evict_policy)};
    size_t n = 0;
    budget_holder *h = list_candidates(k, protect, &n);
    size_t *victims = n ? calloc(n, sizeof *victims) : NULL;
    size_t n_victims = 0;
    budget_verdict v = budget_plan(&p, residency_total_bytes(k), need, h, victims ? n : 0,
                                   sched__unix_ms(), victims, &n_victims);
    for (size_t i = 0; i < n_victims; i++) {
        const budget_holder *victim = &h[victims[i]];
        if (victim->c.kind == EVICT_KIND_SESSION) {
            session_start_swap_out(k, victim->c.user);
        } else if (victim->flags & BUDGET_KEPT) {
            /* Still swapped out: it comes back by a load from the file. */
            residency_drop(victim->c.user);
        } else {
            residency_swap_out(k, victim->c.user);
        }
    }
    bool writes = false;
    for (size_t i = 0; i < n; i++) writes |= (h[i].flags & BUDGET_LEAVING) != 0;
    for (size_t i = 0; i < n_victims; i++) writes |= (h[victims[i]].flags & BUDGET_ASYNC) != 0;
    if (v == BUDGET_NEVER) {
        /* No eviction and no request's end can ever make room: say so now, with both sizes,
         * rather than after limits.memory_wait_ms. */
        const uint64_t fixed = budget_fixed_bytes(h, victims ? n : 0);
        char kept[256] = "";
        size_t len = 0;
        for (size_t i = 0; victims && i < n && len < sizeof kept; i++)
            if ((h[i].flags & (BUDGET_PINNED | BUDGET_TARGET)) && h[i].c.bytes)
                len +=
                    (size_t)snprintf(kept + len, sizeof kept - len, "%s%s '%s' %.1f MiB%s",
                                     len ? ", " : "", "model", h[i].name, h[i].c.bytes / 1048576.0,
                                     h[i].flags & BUDGET_PINNED ? " (pinned)" : " (in use)");
        if (need > c->memory_limit || !fixed)
            corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                             "%.1f MiB are needed but memory.limit is %.1f MiB: it can never fit",
                             need / 1048576.0, c->memory_limit / 1048576.0);
        else
            corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                             "%.1f MiB are needed but memory.limit is %.1f MiB and %.1f MiB of it "
                             "stay held (%s): it can never fit",
                             need / 1048576.0, c->memory_limit / 1048576.0, fixed / 1048576.0,
                             kept);
        free(victims);
        free(h);
        return v;
    }
    free(victims);
    free(h);
    /* The plan worked from the holders' figures; the accounting has the last word. */
    if (v == BUDGET_FITS && residency_total_bytes(k) + need > c->memory_limit)
        v = writes ? BUDGET_WAIT : BUDGET_FULL;
    if (v == BUDGET_FULL) {
        char holders[CORRAL_ERROR_MESSAGE_MAX - 96];
        describe_holders(k, &p, holders, sizeof holders);
        corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED, "no room for %.1f MiB: %s",
                         need / 1048576.0, holders);
    }
    return v;
}

/* ---- loading (on the loader) ----------------------------------------------------------------- */

/* A load or swap-in of one model. The compute thread leaves the model's parts alone while it is
 * LOADING; the task's results are taken in by load_finish. */
typedef struct load_task {
    core_task t;
    struct core *k; /* woken when the progress moves */
    sched_model *sm;
    cfg_gen *gen;           /* held while the task lives: entry and cache settings point in it */
    const cfg_model *entry; /* the model's configuration */
    bool restore;           /* map the weights again under what sm kept */
    bool from_swap;         /* sm was swapped out: this load is its swap-in (counted as such) */
    model *kept;            /* restore: sm's model (tokenizer, metadata, released weights) */
    mem_owner *owner;       /* the arena everything is allocated in */
    bool verify_full;       /* check every byte of a cached merged image */
    uint32_t max_batch;
    threadpool *compute_pool; /* the runner's */
    threadpool *merge_pool;
    /* Results. */
    corral_status status;
    corral_error err;
    bool restore_failed; /* the kept parts cannot serve (file changed): load it afresh */
    char *weights_path;
    bool merged;
    double merge_seconds;
    image_problem merge_reason;
    model *m;
    model_runner *runner;
    policy_vocab *pv;
    uint32_t context;
    chat_template tmpl;
    residency_source *sources; /* a variant's inputs as they were (default arena) */
    size_t n_sources;
    int64_t us;
    /* How far it got, per phase (progress_word below; 0: not reached), indexed by job_phase:
     * written by the loader, read by the compute thread, which passes them on to the jobs
     * waiting (residency_report_progress). A load goes through its phases in load_phases' order,
     * so each job is told every phase it went through, in order, even when the compute thread
     * looked only after a phase was over. */
    _Atomic uint64_t progress[JOB_PHASE_QUANTIZING + 1];
    /* The highest class of the jobs waiting for it (0: none, a preload), kept by the compute
     * thread (residency_note_classes). */
    atomic_int waiter_class;
    int progress_phase;         /* loader: the phase of its last note */
    unsigned progress_permille; /* loader: the last fraction that woke the compute thread */
} load_task;

/* A load's progress in one word, so that the compute thread never reads a phase with another
 * phase's figures: the phase in the top 8 bits, done and total (tensors: far below 2^28) in 28
 * bits each. */
static uint64_t progress_word(job_phase phase, uint64_t done, uint64_t total) {
    const uint64_t mask = (1ull << 28) - 1;
    if (total > mask) {
        done = done * mask / total;
        total = mask;
    }
    return (uint64_t)phase << 56 | (done & mask) << 28 | (total & mask);
}

static job_progress progress_unpack(uint64_t w) {
    const uint64_t mask = (1ull << 28) - 1;
    return (job_progress){.phase = (job_phase)(w >> 56), .done = w >> 28 & mask, .total = w & mask};
}

/* Between two tensors of a merge, quantization or repack, or two pieces of a tensor's write
 * (loader thread; load_note and load_pace): while the compute thread has realtime work in hand
 * and this load serves none, wait. On a machine whose cores the compute threads fill, the load
 * would otherwise take one of them from the realtime request's prefill, whose step waits for its
 * slowest thread (the time to first token of a voice command while a variant merged: 1.7-1.8x
 * idle). The load goes on when the realtime work is done, or at once when it is cancelled or a
 * realtime request starts waiting for it. */
static void load_step_aside(load_task *t) {
    const struct timespec pause = {.tv_nsec = 2 * 1000 * 1000};
    while (atomic_load(&t->k->compute_class) >= CFG_PRIORITY_REALTIME &&
           atomic_load(&t->waiter_class) < CFG_PRIORITY_REALTIME && !atomic_load(&t->t.base.cancel))
        nanosleep(&pause, NULL);
}

/* Record the load's progress (loader thread); the compute thread is woken when the phase changes
 * or the fraction moves by a tenth of a percent or more, not at every tensor. Then step aside
 * for realtime work, if any. */
static void load_note(load_task *t, job_phase phase, uint64_t done, uint64_t total) {
    atomic_store(&t->progress[phase], progress_word(phase, done, total));
    const unsigned permille = total ? (unsigned)(done * 1000 / total) : 0;
    if ((int)phase != t->progress_phase || permille != t->progress_permille) {
        t->progress_phase = (int)phase;
        t->progress_permille = permille;
        core_poke(t->k);
    }
    load_step_aside(t);
}

/* The pause point of the work's progress (corral_progress.pace): inside a tensor's write. */
static void load_pace(void *user) {
    load_step_aside(user);
}

static void load_note_merging(void *user, uint64_t done, uint64_t total) {
    load_note(user, JOB_PHASE_MERGING, done, total);
}

static void load_note_repacking(void *user, uint64_t done, uint64_t total) {
    load_note(user, JOB_PHASE_REPACKING, done, total);
}

static void load_note_quantizing(void *user, uint64_t done, uint64_t total) {
    load_note(user, JOB_PHASE_QUANTIZING, done, total);
}

/* The phases of a load in the order they happen: a variant is merged, or made quantized (with
 * its adapters merged as it goes), before its weights are rearranged. */
static const job_phase load_phases[] = {JOB_PHASE_LOADING, JOB_PHASE_MERGING, JOB_PHASE_QUANTIZING,
                                        JOB_PHASE_REPACKING};
#define N_LOAD_PHASES (sizeof load_phases / sizeof load_phases[0])

/* Whether a job wants its model's load progress: a Generate always (its client handles Progress
 * anyway), a Load or Pin that asked for it; a Tokenize never (its client waits for one reply). */
static bool wants_load_progress(const sjob *sj) {
    const core_request *r = &sj->j->req;
    return r->kind == CORE_GENERATE ||
           ((r->kind == CORE_LOAD || r->kind == CORE_PIN) && r->target.progress);
}

/* Tell sj what t reached since its last report: each phase from the one it was told last on,
 * in order, with its latest figures. */
static void report_load(sjob *sj, load_task *t) {
    const job_phase last = (job_phase)(sj->load_progress >> 56);
    size_t from = 0;
    while (sj->load_progress && from + 1 < N_LOAD_PHASES && load_phases[from] != last) from++;
    for (size_t i = from; i < N_LOAD_PHASES; i++) {
        const uint64_t w = atomic_load(&t->progress[load_phases[i]]);
        if (!w || w == sj->load_progress) continue;
        sj->load_progress = w;
        const job_progress p = progress_unpack(w);
        job_emit_progress(sj->j, p.phase, p.done, p.total);
    }
}

void residency_note_classes(struct core *k) {
    int in_hand = 0;
    for (sched_model *sm = k->models; sm; sm = sm->next) sm->load_waiter_class = 0;
    for (const sjob *sj = k->jobs; sj; sj = sj->next) {
        const int prio = (int)sj->priority;
        const bool computing = sj->phase == SJOB_PREPARING || sj->phase == SJOB_SESSION_IN ||
                               sj->phase == SJOB_READY ||
                               (sj->phase == SJOB_ACTIVE && !atomic_load(&sj->j->paused));
        if (computing && prio > in_hand) in_hand = prio;
        if (sj->phase == SJOB_WAIT_MODEL && sj->model && prio > sj->model->load_waiter_class)
            sj->model->load_waiter_class = prio;
    }
    atomic_store(&k->compute_class, in_hand);
    for (sched_model *sm = k->models; sm; sm = sm->next)
        if (sm->loading) atomic_store(&sm->loading->waiter_class, sm->load_waiter_class);
}

void residency_report_progress(struct core *k) {
    for (sjob *sj = k->jobs; sj; sj = sj->next) {
        load_task *t = sj->model ? sj->model->loading : NULL;
        if (t && sj->phase == SJOB_WAIT_MODEL && wants_load_progress(sj)) report_load(sj, t);
    }
}

/* The file to map: the model's own, or for a variant the merged (or quantized) image in
 * cache.dir, merging its adapters and quantizing first when the cache has no valid image
 * (cancellable between tensors). */
static corral_status load_weights_path(load_task *t, corral_error *err) {
    const cfg_model *mc = t->entry;
    const char *path = mc->path;
    lora_variant v;
    if (mc->n_adapters > 0 || mc->quantize) {
        if (mc->n_adapters > LORA_MAX_ADAPTERS)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "model '%s': more than %d adapters", mc->name,
                                    LORA_MAX_ADAPTERS);
        lora_source sources[LORA_MAX_ADAPTERS];
        for (size_t i = 0; i < mc->n_adapters; i++)
            sources[i] =
                (lora_source){.path = mc->adapters[i].path, .scale = mc->adapters[i].scale};
        const lora_variant_request req = {
            .base_path = mc->path,
            .adapters = sources,
            .n_adapters = (uint32_t)mc->n_adapters,
            .quantize = mc->quantize,
            .cache_dir = t->gen->c->cache_dir,
            .cache_limit_bytes = t->gen->c->cache_limit,
            .pool = t->merge_pool,
            /* Every byte is checked the first time; later swap-ins trust the verified image. */
            .verify = t->verify_full ? IMAGE_VERIFY_FULL : IMAGE_VERIFY_METADATA,
            .cancel = &t->t.base.cancel,
            .progress = {.fn = mc->quantize ? load_note_quantizing : load_note_merging,
                         .user = t,
                         .pace = load_pace}};
        const unsigned scope = mem_scope_default();
        corral_status st = lora_variant_prepare(&req, &v, err);
        mem_scope_leave(scope);
        if (st != CORRAL_OK) return corral_error_prefix(err, "model '%s'", mc->name);
        t->merged = !v.cache_hit;
        t->merge_seconds = v.merge_seconds;
        t->merge_reason = v.reason;
        path = v.path;
    }
    const unsigned scope = mem_scope_default();
    t->weights_path = strdup(path);
    mem_scope_leave(scope);
    return t->weights_path ? CORRAL_OK
                           : corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
}

/* Keep the cache directory (merged variants and rearranged weights, one budget) under
 * cache.limit, least recently used first; `in_use` (a path in it, or NULL) stays. */
static void cache_trim(const cfg *c, const char *in_use) {
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

/* A model configured with context 0 gets its own trained context, halved while one KV cache of
 * it (kv_cache_bytes_for: sliding-window layers count their window only) would take more than
 * RESIDENCY_CONTEXT_SHARE of memory.limit: a session holds a cache of the whole context, and
 * several must fit beside the weights. Never below RESIDENCY_MIN_CONTEXT (or the model's own). */
#define RESIDENCY_CONTEXT_SHARE 0.25
#define RESIDENCY_MIN_CONTEXT   512u

static uint32_t residency_default_context(const model *m, const cfg_model *mc, uint64_t limit) {
    const uint32_t train = model_get_hparams(m)->n_ctx_train;
    const kv_type kvt = mc->kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16;
    const double room = RESIDENCY_CONTEXT_SHARE * (double)limit;
    uint32_t ctx = train;
    while (ctx / 2 >= RESIDENCY_MIN_CONTEXT && (double)kv_cache_bytes_for(m, ctx, kvt) > room)
        ctx /= 2;
    if (ctx < train)
        log_info("model context sized by memory", LOG_STR("model", mc->name),
                 LOG_UINT("context", ctx), LOG_UINT("trained", train),
                 LOG_F64("kv_cache_mib", kv_cache_bytes_for(m, ctx, kvt) / 1048576.0),
                 LOG_F64("memory_limit_mib", limit / 1048576.0));
    return ctx;
}

/* Load from scratch: model, runner, vocabulary, all in the task's arena. */
static corral_status load_fresh(load_task *t, corral_error *err) {
    const cfg_model *mc = t->entry;
    const unsigned scope = mem_scope_enter(t->owner);
    /* The weights the kernels want rearranged are mapped from an image in the cache directory
     * (written on the first load of a file), so a load or swap-in costs no rearranging. */
    const model_params mp = {
        .compute = MODEL_COMPUTE_FAST,
        .cache_dir = t->gen->c->cache_dir,
        .repack_progress = {.fn = load_note_repacking, .user = t, .pace = load_pace}};
    model *m = model_load(t->weights_path, &mp, err);
    model_runner *r = NULL;
    policy_vocab *pv = NULL;
    uint32_t ctx = 0;
    chat_template tmpl = CHAT_TEMPLATE_NONE;
    if (!m) {
        corral_error_prefix(err, "model '%s'", mc->name);
    } else {
        const model_hparams *hp = model_get_hparams(m);
        ctx = (uint32_t)mc->context;
        if (ctx == 0) ctx = residency_default_context(m, mc, t->gen->c->memory_limit);
        /* (An override is looked up below; the file's template is not needed then.) */
        if (!mc->chat_template) tmpl = prompt_file_chat_template(model_get_gguf(m));
        corral_error why;
        if (ctx > hp->n_ctx_train)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                             "model '%s': configured context %u exceeds the model's %u", mc->name,
                             ctx, hp->n_ctx_train);
        else if (mc->chat_template &&
                 (tmpl = chat_template_from_name(mc->chat_template, &why)) == CHAT_TEMPLATE_UNKNOWN)
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "model '%s': %s", mc->name, why.message);
        else if (!(r = model_runner_new(m, t->max_batch, t->compute_pool, err)))
            corral_error_prefix(err, "model '%s'", mc->name);
        else if (!(pv = policy_vocab_new(model_get_tokenizer(m), err))) {
            corral_error_prefix(err, "model '%s'", mc->name);
            model_runner_destroy(&r);
        }
    }
    if (!r) {
        model_destroy(&m);
        mem_scope_leave(scope);
        return err->status;
    }
    mem_scope_leave(scope);
    t->m = m;
    t->runner = r;
    t->pv = pv;
    t->context = ctx;
    t->tmpl = tmpl;
    return CORRAL_OK;
}

/* Stamp the files a variant is made from (its base, its adapters' files), as they are now:
 * before the merge reads them, so that a change during the merge shows as a change. Nothing for
 * a plain model (model_file_check covers its one file). A file that cannot be stamped is left
 * out: the merge then reports it. */
static void record_sources(load_task *t) {
    const cfg_model *mc = t->entry;
    if ((mc->n_adapters == 0 && !mc->quantize) || mc->n_adapters > LORA_MAX_ADAPTERS) return;
    const unsigned scope = mem_scope_default();
    t->sources = calloc(1 + 2 * mc->n_adapters, sizeof *t->sources);
    for (size_t i = 0; t->sources && i <= mc->n_adapters; i++) {
        char files[2][LORA_PATH_MAX];
        int n = 1;
        if (i == 0)
            snprintf(files[0], sizeof files[0], "%s", mc->path);
        else
            n = lora_adapter_files(mc->adapters[i - 1].path, files, NULL);
        for (int f = 0; f < n; f++) {
            residency_source *s = &t->sources[t->n_sources];
            if (image_file_stamp_read(files[f], &s->stamp, NULL) != CORRAL_OK) continue;
            if ((s->path = strdup(files[f]))) t->n_sources++;
        }
    }
    mem_scope_leave(scope);
}

/* The load itself (load_run guards it). */
static void load_run_unguarded(load_task *t) {
    actor_task *base = &t->t.base;
    record_sources(t);
    t->status = load_weights_path(t, &t->err);
    if (t->status == CORRAL_OK && atomic_load(&base->cancel))
        t->status = corral_error_set(&t->err, CORRAL_CANCELLED, "the load was cancelled");
    if (t->status == CORRAL_OK && t->restore) {
        /* Only when the weights are still at the path the kept parts came from (a variant's image
         * still valid) and the file is unchanged. */
        corral_error why;
        corral_status st = CORRAL_FAILED_PRECONDITION;
        if (strcmp(gguf_path(model_get_gguf(t->kept)), t->weights_path) == 0) {
            const unsigned scope = mem_scope_enter(t->owner);
            st = model_weights_restore(t->kept, &why);
            mem_scope_leave(scope);
        } else {
            corral_error_set(&why, CORRAL_FAILED_PRECONDITION, "its weights moved to %s",
                             t->weights_path);
        }
        if (st != CORRAL_OK) {
            log_warn("swapped-out model cannot be restored; loading it again",
                     LOG_STR("model", t->entry->name), LOG_STR("reason", why.message));
            t->restore_failed = true;
        }
    } else if (t->status == CORRAL_OK) {
        t->status = load_fresh(t, &t->err);
        if (t->status == CORRAL_OK) cache_trim(t->gen->c, model_repack_path(t->m));
    }
}

/* A load reads mapped files (the model file's metadata and vocabulary, its weights while they are
 * rearranged, a variant's base while it is merged): one truncated meanwhile faults, and the
 * guard turns that into a failed load (fault.h). What the jump skipped leaked into the task's
 * arena (destroyed with it: a failed fresh load has no owner left) and a few mappings; a restore
 * cut short leaves the kept model released and unusable: its parts are dropped (stale). */
static void load_run(actor_task *base) {
    load_task *t = (load_task *)base;
    const int64_t t0 = sched__mono_us();
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        load_run_unguarded(t);
        fault_guard_leave(&g);
    } else {
        (void)mem_scope_default(); /* whatever scope the jump left behind */
        char where[64];
        snprintf(where, sizeof where, "%#lx", (unsigned long)g.info.addr);
        log_warn("a mapped file failed while a model was loaded", LOG_STR("model", t->entry->name),
                 LOG_STR("address", where), LOG_STR("what", fault_code_text(g.info.code)));
        if (t->restore && t->status == CORRAL_OK) {
            t->restore_failed = true;
        } else {
            t->status = corral_error_set(
                &t->err, CORRAL_IO,
                "model '%s': %s (or a file it is made from) failed while it was loaded (SIGBUS: "
                "%s): it was truncated or changed meanwhile",
                t->entry->name, t->weights_path ? t->weights_path : t->entry->path,
                fault_code_text(g.info.code));
            /* The parts made so far may be half-built: never used, never freed one by one. */
            t->m = NULL;
            t->runner = NULL;
            t->pv = NULL;
        }
    }
    t->us = sched__mono_us() - t0;
}

/* Throw away a fresh load's parts (cancelled, or failed after the load). */
static void load_discard(load_task *t) {
    const unsigned scope = mem_scope_enter(t->owner);
    model_runner_destroy(&t->runner);
    policy_vocab_destroy(&t->pv);
    model_destroy(&t->m);
    mem_scope_leave(scope);
}

static void load_finish(struct core *k, core_task *ct) {
    load_task *t = (load_task *)ct;
    sched_model *sm = t->sm;
    /* Every job waiting hears how the load ended, phase by phase, before its answer. */
    for (sjob *sj = k->jobs; sj; sj = sj->next)
        if (sj->model == sm && sj->phase == SJOB_WAIT_MODEL && wants_load_progress(sj))
            report_load(sj, t);
    sm->loading = NULL;
    sm->reserved = 0;
    const bool cancelled = !t->t.base.ran || atomic_load(&t->t.base.cancel);
    if (t->merged && t->status == CORRAL_OK) {
        sm->merges++;
        sm->merge_us = (int64_t)(t->merge_seconds * 1e6);
        log_info(t->entry->quantize ? "variant quantized" : "variant merged",
                 LOG_STR("model", sm->name), LOG_STR("base", t->entry->path),
                 LOG_UINT("adapters", t->entry->n_adapters), LOG_F64("seconds", t->merge_seconds),
                 LOG_STR("reason", image_problem_name(t->merge_reason)),
                 LOG_STR("image", t->weights_path));
    }
    if (t->status == CORRAL_OK && (t->entry->n_adapters || t->entry->quantize)) sm->verified = true;
    /* A broken model that is not loaded stays BROKEN (Status keeps saying why) until a load
     * succeeds. */
    const core_model_state unloaded = sm->broken ? CORE_MODEL_BROKEN : CORE_MODEL_UNLOADED;
    if (t->restore_failed) {
        /* The kept parts are stale: they and the sessions made with them go, then the waiting
         * jobs load it afresh. */
        sm->state = CORE_MODEL_SWAPPED;
        sm->stale = true;
    } else if (cancelled && t->status == CORRAL_OK) {
        log_info("load cancelled: no request waits for it any more", LOG_STR("model", sm->name));
        if (t->restore) {
            model_weights_release(sm->m);
            sm->state = CORE_MODEL_SWAPPED;
        } else {
            load_discard(t);
            mem_owner_destroy(&sm->owner);
            sm->state = unloaded;
        }
    } else if (t->status != CORRAL_OK) {
        if (t->restore) {
            sm->state = CORE_MODEL_SWAPPED;
        } else {
            /* Whatever the failed load made lives in the arena, which goes with it. */
            load_discard(t);
            mem_owner_destroy(&sm->owner);
            sm->state = unloaded;
            if (sm->broken && t->status != CORRAL_CANCELLED)
                snprintf(sm->broken_reason, sizeof sm->broken_reason, "%s", t->err.message);
        }
        if (t->status != CORRAL_CANCELLED) {
            log_warn("model load failed", LOG_STR("model", sm->name),
                     LOG_STR("error", t->err.message));
            sched_fail_waiting(k, sm, &t->err);
        } else {
            log_info("load cancelled: no request waits for it any more",
                     LOG_STR("model", sm->name));
        }
    } else {
        if (!t->restore) {
            sm->m = t->m;
            sm->runner = t->runner;
            sm->pv = t->pv;
            sm->context = t->context;
            sm->tmpl = t->tmpl;
        }
        sources_free(&sm->sources, &sm->n_sources);
        sm->sources = t->sources;
        sm->n_sources = t->n_sources;
        t->sources = NULL;
        t->n_sources = 0;
        if (t->from_swap) sm->swap_ins++;
        sm->was_swapped = false;
        free(sm->weights_path);
        sm->weights_path = t->weights_path;
        t->weights_path = NULL;
        mem_owner_set_mapped(sm->owner, gguf_file_size(model_get_gguf(sm->m)));
        if (t->restore) {
            const uint64_t now = residency_model_bytes(sm),
                           mapped = mem_owner_mapped_bytes(sm->owner);
            if (now > sm->reserved_base + mapped &&
                now - sm->reserved_base - mapped > sm->restore_heap)
                sm->restore_heap = now - sm->reserved_base - mapped;
        }
        corral_error err;
        if (batch_alloc(k, sm, &err) != CORRAL_OK) {
            residency_drop(sm);
            sm->state = CORE_MODEL_UNLOADED;
            sched_fail_waiting(k, sm, &err);
        } else {
            sm->state = CORE_MODEL_RESIDENT;
            sm->broken = false;
            sm->broken_reason[0] = '\0';
            sm->load_us = t->us;
            sm->last_used_ms = sched__unix_ms(); /* loading is a use: keep-alives run from here */
            log_info(
                t->from_swap ? "model swapped in" : "model loaded", LOG_STR("model", sm->name),
                LOG_STR("path", sm->weights_path), LOG_STR("arch", model_get_hparams(sm->m)->arch),
                LOG_UINT("context", sm->context), LOG_STR("template", chat_template_name(sm->tmpl)),
                LOG_STR("how", t->restore ? "weights mapped again" : "loaded from the file"),
                LOG_F64("ms", sm->load_us / 1000.0), LOG_UINT("bytes", residency_model_bytes(sm)));
            /* The reservation was a guess: if the model turned out bigger, make room now. */
            corral_error ignored;
            residency_make_room(k, 0, sm, &ignored);
        }
    }
    free(t->weights_path);
    sources_free(&t->sources, &t->n_sources);
    sched_config_unref(k, t->gen);
    free(t);
}

/* A load task for sm; NULL when out of memory. */
static load_task *load_task_new(struct core *k, sched_model *sm, bool from_swap) {
    load_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    actor_task_init(&t->t.base, load_run, 0);
    t->t.finish = load_finish;
    t->k = k;
    for (int phase = 0; phase <= JOB_PHASE_QUANTIZING; phase++) atomic_init(&t->progress[phase], 0);
    atomic_store(&t->progress[JOB_PHASE_LOADING], progress_word(JOB_PHASE_LOADING, 0, 0));
    t->progress_phase = JOB_PHASE_LOADING;
    atomic_init(&t->waiter_class, 0);
    t->sm = sm;
    t->gen = k->config;
    k->config->refs++;
    t->entry = sm->cfg;
    t->restore = residency_kept(sm) && !sm->stale;
    t->from_swap = from_swap;
    t->kept = t->restore ? sm->m : NULL;
    t->verify_full = !sm->verified;
    const cfg *c = core_cfg(k);
    /* A batch step runs a prefill chunk beside one token of each other active job. */
    t->max_batch = (uint32_t)(c->prefill_chunk + c->active_per_model) + SCHED_MAX_REALTIME_EXTRA;
    t->compute_pool = k->pool;
    t->merge_pool = k->loader_pool;
    return t;
}

/* Bytes to reserve for loading sm. */
static uint64_t load_need(const sched_model *sm) {
    const uint64_t file = file_bytes(sm->cfg->path);
    /* A swapped-out model that kept its heap only needs room for its weights again, and for
     * what mapping them takes. */
    if (residency_kept(sm) && !sm->stale)
        return file + (sm->restore_heap ? sm->restore_heap : MODEL_RESTORE_HEAP_GUESS);
    return file + MODEL_HEAP_RESERVE + file / 64;
}

/* Make the parts the task needs: a fresh load gets an arena of its own. */
static corral_status load_begin(struct core *k, sched_model *sm, load_task *t, corral_error *err) {
    (void)k;
    if (!t->restore) {
        if (sm->owner) residency_drop(sm); /* stale kept parts (their sessions are out) */
        sm->owner = mem_owner_new();
        if (!sm->owner)
            return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "model '%s': no memory owner",
                                    sm->name);
    }
    t->owner = sm->owner;
    sm->reserved_base = residency_model_bytes(sm);
    sm->reserved = load_need(sm);
    sm->state = CORE_MODEL_LOADING;
    sm->loads++;
    sm->loading = t;
    return CORRAL_OK;
}

/* Whether resident sm still maps the files it was loaded from (see the file comment). When not,
 * it is broken (a file changed in place) or reloaded once its requests end (replaced, or a
 * variant's inputs changed), and false is returned: the job waits for the load. */
static bool files_unchanged(struct core *k, sched_model *sm) {
    corral_error err;
    image_file_change c = model_file_check(sm->m, &err);
    /* A variant maps its merged image in cache.dir: trimming may delete it, and a merge may
     * replace it, while the mapping keeps its bytes; only a change in place matters. */
    if (c == IMAGE_FILE_REPLACED && (sm->cfg->n_adapters || sm->cfg->quantize)) c = IMAGE_FILE_SAME;
    if (c == IMAGE_FILE_MODIFIED) {
        char why[CORRAL_ERROR_MESSAGE_MAX];
        snprintf(why, sizeof why, "%.400s: the weights it maps changed under it", err.message);
        residency_break(k, sm, why);
        return false;
    }
    for (size_t i = 0; c == IMAGE_FILE_SAME && i < sm->n_sources; i++) {
        char what[256];
        c = image_file_stamp_compare(&sm->sources[i].stamp, sm->sources[i].path, what, sizeof what);
        if (c != IMAGE_FILE_SAME)
            corral_error_set(&err, CORRAL_FAILED_PRECONDITION,
                             "%s, which the variant was merged from, changed on disk: %s",
                             sm->sources[i].path, what);
    }
    if (c == IMAGE_FILE_SAME) return true;
    log_warn("model file changed on disk: the model is loaded again once its requests end",
             LOG_STR("model", sm->name), LOG_STR("reason", err.message));
    sm->reload_pending = true;
    return false;
}

residency_state residency_want(struct core *k, sched_model *sm, corral_error *err) {
    sm->unload_requested = false; /* wanted again */
    /* A changed entry: the old model goes when its requests end, then this one loads it. */
    if (sm->reload_pending) return RESIDENCY_PENDING;
    if (sm->state == CORE_MODEL_RESIDENT)
        return files_unchanged(k, sm) ? RESIDENCY_READY : RESIDENCY_PENDING;
    if (sm->state == CORE_MODEL_LOADING) return RESIDENCY_PENDING;
    /* Broken: its parts go once no job holds them (residency_tick), then it loads afresh. */
    if (sm->state == CORE_MODEL_BROKEN && sm->owner) return RESIDENCY_PENDING;
    const bool from_swap = sm->was_swapped;
    if (sm->stale) {
        /* Kept parts that cannot serve: their sessions go out first, then the arena. */
        if (!unload_when_possible(k, sm)) return RESIDENCY_PENDING;
    }
    switch (residency_make_room(k, load_need(sm), sm, err)) {
        case BUDGET_FITS:
            break;
        case BUDGET_WAIT:
            return RESIDENCY_PENDING;
        case BUDGET_FULL:
            return RESIDENCY_NO_ROOM;
        case BUDGET_NEVER:
            corral_error_prefix(err, "model '%s' cannot be loaded", sm->name);
            return RESIDENCY_NEVER_FITS;
    }
    load_task *t = load_task_new(k, sm, from_swap);
    if (!t || load_begin(k, sm, t, err) != CORRAL_OK) {
        if (t) sched_config_unref(k, t->gen);
        free(t);
        if (!t) corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return RESIDENCY_FAILED;
    }
    sched_post(k, k->loader, &t->t);
    return RESIDENCY_PENDING;
}

corral_status residency_load_now(struct core *k, sched_model *sm, corral_error *err) {
    corral_error_clear(err);
    if (residency_make_room(k, load_need(sm), sm, err) != BUDGET_FITS)
        return err->status != CORRAL_OK
                   ? err->status
                   : corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                      "model '%s': no room in memory.limit", sm->name);
    load_task *t = load_task_new(k, sm, false);
    if (!t || load_begin(k, sm, t, err) != CORRAL_OK) {
        if (t) sched_config_unref(k, t->gen);
        free(t);
        return t ? err->status : corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    t->t.base.ran = true;
    load_run(&t->t.base);
    if (t->status != CORRAL_OK) *err = t->err;
    load_finish(k, &t->t);
    if (sm->state == CORE_MODEL_RESIDENT) return CORRAL_OK;
    return err->status != CORRAL_OK
               ? err->status
               : corral_error_set(err, CORRAL_INTERNAL, "model '%s' could not be loaded", sm->name);
}

void residency_forget_load(struct core *k, sched_model *sm) {
    if (!sm->loading) return;
    for (const sjob *sj = k->jobs; sj; sj = sj->next)
        if (sj->model == sm && sj->phase == SJOB_WAIT_MODEL) return;
    atomic_store(&sm->loading->t.base.cancel, 1);
}

/* ---- configuration --------------------------------------------------------------------------- */

static bool entry_changed(const cfg_model *a, const cfg_model *b) {
    if (a->n_adapters != b->n_adapters || strcmp(a->path, b->path) != 0 ||
        a->context != b->context || a->kv_f32 != b->kv_f32 ||
        (a->chat_template == NULL) != (b->chat_template == NULL) ||
        (b->chat_template && strcmp(a->chat_template, b->chat_template) != 0) ||
        (a->quantize == NULL) != (b->quantize == NULL) ||
        (b->quantize && strcasecmp(a->quantize, b->quantize) != 0))
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
            sm->removed = true; /* residency_tick unloads it once idle */
            continue;
        }
        if (sm->cfg && entry_changed(sm->cfg, entry)) {
            /* A resident model goes once idle and its next load uses the new entry; what a
             * swapped-out one kept was made under the old entry. */
            if (sm->state == CORE_MODEL_RESIDENT || sm->state == CORE_MODEL_LOADING)
                sm->reload_pending = true;
            else if (residency_kept(sm))
                sm->stale = true;
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
        if (sm->state == CORE_MODEL_LOADING) continue;
        if (sm->state == CORE_MODEL_BROKEN) {
            if (sm->owner && !residency_busy(k, sm) && drop_broken_parts(k, sm))
                log_info("broken model's memory released", LOG_STR("model", sm->name));
            continue;
        }
        const bool held = sm->state == CORE_MODEL_RESIDENT || residency_kept(sm);
        /* A stale swapped-out model stays until a request wants it (residency_want). */
        if (sm->stale) continue;
        if (!held) {
            sm->reload_pending = sm->unload_requested = false;
            continue;
        }
        /* Gone from the config, changed, asked to unload, stale, or its keep-alive ran out:
         * give the memory back once it is idle. A keep-alive runs from the last use, and never
         * while a request is on its way to the model. */
        bool wanted = false;
        for (const sjob *sj = k->jobs; sj && !wanted; sj = sj->next) wanted = sj->model == sm;
        const bool expired = !wanted && sm->cfg->ttl_ms && !sm->pinned &&
                             now_ms - sm->last_used_ms > sm->cfg->ttl_ms;
        if ((sm->removed || sm->reload_pending || sm->unload_requested || sm->stale || expired) &&
            !residency_busy(k, sm))
            unload_when_possible(k, sm);
    }
}

corral_status residency_unload(struct core *k, sched_model *sm) {
    if (residency_busy(k, sm)) return CORRAL_FAILED_PRECONDITION;
    if (sm->state == CORE_MODEL_LOADING) {
        atomic_store(&sm->loading->t.base.cancel, 1);
        return CORRAL_OK;
    }
    if (sm->state == CORE_MODEL_RESIDENT || residency_kept(sm)) {
        /* The weights go now; the rest once its sessions' caches are written out. */
        if (sm->state == CORE_MODEL_RESIDENT) {
            model_weights_release(sm->m);
            mem_owner_set_mapped(sm->owner, 0);
            sm->state = CORE_MODEL_SWAPPED;
        }
        if (!unload_when_possible(k, sm)) sm->unload_requested = true;
    }
    return CORRAL_OK;
}

void residency_free_all(struct core *k) {
    for (sched_model *sm = k->models, *next; sm; sm = next) {
        next = sm->next;
        residency_drop(sm);
        free(sm->weights_path);
        free(sm->name);
        free(sm);
    }
    k->models = NULL;
}
