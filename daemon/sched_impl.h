/*
 * sched_impl.h — the core's state, shared by the files that make up the scheduler (private to
 * daemon/). Everything here belongs to the compute thread unless a field says otherwise.
 *
 *   sched.c      the core's interface (core.h), the thread's loop, admission, the pick rule
 *   batch.c      one step: a batch of one model's jobs through one forward pass
 *   prepare.c    a Generate's parameters, sanitizers, prompt tokens and constraint
 *   residency.c  models: loading, swapping out and in, unloading, the memory budget's holders
 *   session.c    conversations kept between requests, their KV caches on disk and back
 *   status.c     answers that describe the daemon: Status, ListModels (plain structs)
 *   config_gen.c configurations and their sanitizer profiles, kept while jobs use them
 */
#ifndef CORRAL_DAEMON_SCHED_IMPL_H
#define CORRAL_DAEMON_SCHED_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "budget.h"
#include "config.h"
#include "core.h"
#include "corral/chat.h"
#include "corral/evict.h"
#include "corral/generate.h"
#include "corral/model.h"
#include "corral/policy.h"
#include "corral/threadpool.h"
#include "job.h"
#include "mem.h"
#include "swap.h"

/* Defaults the config does not set. */
#define SCHED_DEFAULT_MAX_TOKENS  256
#define SCHED_DEFAULT_CONTEXT_CAP 4096
/* How often a request that waits for memory tries again. */
#define SCHED_MEMORY_RETRY_US     50000
/* Realtime requests always start; this many may run beside a model's active_per_model others. */
#define SCHED_MAX_REALTIME_EXTRA  8

/* ---- configurations ---------------------------------------------------------------------------
 */

/* One configuration with its sanitizer profiles built. Jobs admitted under it hold a reference,
 * so a reload never frees what a running job still reads; the generation is freed when it is no
 * longer current and its last job ends. */
typedef struct cfg_gen {
    cfg *c;
    policy_profile **profiles;
    size_t n_profiles;
    uint32_t refs; /* jobs admitted under it, plus one while it is current */
    bool first;    /* the configuration the core started with: kept until core_destroy */
    struct cfg_gen *next;
} cfg_gen;

/* A generation for c with its profiles built (plugins loaded). Takes ownership of c. NULL with
 * err naming the profile and step that failed. */
cfg_gen *cfg_gen_new(cfg *c, corral_error *err);
void cfg_gen_destroy(cfg_gen **g);
/* The profile called name, or NULL. */
const policy_profile *cfg_gen_profile(const cfg_gen *g, const char *name);

/* ---- models -----------------------------------------------------------------------------------
 */

typedef struct sched_model {
    char *name;
    const cfg_model *cfg; /* the entry of the current configuration */
    bool removed;         /* dropped from the config: no new requests; unloaded when idle */
    bool reload_pending;  /* its entry changed: unload when idle, next load uses the new one */
    core_model_state state;
    model *m;
    model_runner *runner;
    uint32_t context; /* KV positions per sequence */
    chat_template tmpl;
    bool pinned;
    uint32_t n_queued; /* jobs counted against queue_per_model (waiting or running) */
    uint32_t n_sessions;
    uint64_t served;
    int64_t last_used_ms; /* Unix time */
    int64_t last_step_us; /* when a batch of it last ran (the pick rule's round robin) */
    uint64_t swap_ins, swap_outs;
    uint64_t loads;        /* loads and swap-ins started */
    mem_owner *owner;      /* its memory: a jemalloc arena and the weights' mapping */
    int64_t load_us;       /* how long the last load took */
    int64_t merge_us;      /* a variant's last merge: what losing its cached image would cost */
    uint64_t merges;       /* merges done for it (a cached image spares them) */
    char *weights_path;    /* the file mapped: cfg->path, or a variant's merged image */
    policy_vocab *pv;      /* its vocabulary for sanitizers and constraints (cached DFAs) */
    bool verified;         /* a variant's merged image was fully checked once */
    struct sjob **members; /* a batch step's jobs (batch.c), batch_cap of them */
    uint32_t batch_cap;
    struct sched_model *next;
} sched_model;

/* ---- sessions ---------------------------------------------------------------------------------
 */

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
    struct sjob *busy; /* the job using it, or NULL */
    int64_t last_used_us;
    int64_t last_used_ms; /* Unix time, for the eviction policy */
    struct sched_session *next;
} sched_session;

/* ---- jobs -------------------------------------------------------------------------------------
 */

/* Where a job is on its way. */
typedef enum sjob_phase {
    SJOB_WAIT_MODEL = 0, /* admitted; its model is not resident yet */
    SJOB_READY = 1,      /* prepared; waiting for an active slot and memory for its cache */
    SJOB_ACTIVE = 2,     /* holds its cache and generator: stepped in batches */
} sjob_phase;

/* The core's state for one job (job->core). Allocated at admission, freed when it ends. */
typedef struct sjob {
    job *j;
    cfg_gen *gen; /* the configuration it was admitted under (a reference) */
    sched_model *model;
    sched_session *session;
    cfg_priority priority;
    sjob_phase phase;
    bool counted; /* in the model's and app's queue totals */
    /* Prepared (prepare.c). */
    gen_params params;
    uint32_t max_tokens;
    const policy_profile *profile;
    int32_t *prompt; /* prompt ids (whole prompt, session prefix included) */
    uint32_t n_prompt;
    uint32_t n_prefilled; /* prompt ids run so far (counting the reused prefix) */
    uint32_t n_cached;    /* ids taken from the session's KV cache */
    int32_t *generated;   /* generated ids, for sessions */
    uint32_t n_generated, cap_generated;
    kv_cache *kv; /* the job's own cache, or its session's */
    generator *g;
    struct policy_gen *pg;  /* its output constraint (regex), or NULL */
    char *sanitizer_report; /* for Done; NULL when no profile ran */
    /* Timing. */
    int64_t started_us, load_us, prefill_us, decode_us;
    int64_t last_step_us;         /* fairness among a model's jobs */
    int64_t retry_at_us;          /* waiting for memory: not before this */
    int64_t memory_wait_until_us; /* waiting for memory: give up at this time */
    char wait_reason[384];        /* waiting for memory: what holds it (the eventual error) */
    struct sjob *next;            /* core->jobs, arrival order */
} sjob;

/* ---- the core ---------------------------------------------------------------------------------
 */

typedef struct app_count {
    char app[64];
    uint32_t n;
    struct app_count *next;
} app_count;

struct core {
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Protected by mu. */
    job *inbox_head, *inbox_tail;
    char *reload_path;
    bool shutdown, quit, idle, poked;
    /* Compute thread only. */
    threadpool *pool; /* compute threads shared by every model (one batch at a time) */
    swap_dir *swap;   /* where session caches go when memory is needed */
    cfg_gen *config;  /* the current configuration */
    cfg_gen *configs; /* every generation still held (the current one among them) */
    const cfg *initial;
    sched_model *models;
    sched_session *sessions;
    sjob *jobs; /* every job that needs a model, arrival order */
    app_count *apps;
    int64_t started_us, started_ms;
    uint64_t served;
};

static inline const cfg *core_cfg(const struct core *k) {
    return k->config->c;
}

/* ---- across the files -------------------------------------------------------------------------
 */

int64_t sched__mono_us(void);
int64_t sched__unix_ms(void);

/* residency.c */
sched_model *residency_find(struct core *k, const char *name);
void residency_sync(struct core *k, const cfg *c);
/* Make sm resident: CORRAL_OK when it is (load_us gets what the load took, if one ran); an error
 * for the jobs waiting for it (CORRAL_RESOURCE_EXHAUSTED: no room now — the caller may wait,
 * unless *never says that no eviction can ever make room). */
corral_status residency_ensure_loaded(struct core *k, sched_model *sm, int64_t *load_us,
                                      bool *never, corral_error *err);
/* Release a resident model: SWAPPED (to make room; comes back by mmap) or UNLOADED (everything
 * freed). Its sessions' caches go to disk first. No request may use it. */
void residency_release(struct core *k, sched_model *sm, core_model_state to);
/* Free everything a model holds (runner, vocabulary, model, arena). */
void residency_drop(sched_model *sm);
bool residency_kept(const sched_model *sm);
bool residency_busy(const struct core *k, const sched_model *sm);
uint64_t residency_model_bytes(const sched_model *sm);
uint64_t residency_total_bytes(const struct core *k);
/* Make `need` more bytes fit (budget.c); `protect` is never evicted. CORRAL_OK, or
 * CORRAL_RESOURCE_EXHAUSTED with err naming the holders (*never set when no eviction can ever
 * help). */
corral_status residency_make_room(struct core *k, uint64_t need, const sched_model *protect,
                                  bool *never, corral_error *err);
/* Housekeeping between steps: keep-alives, removed and changed models. */
void residency_tick(struct core *k);
/* A KV cache of n_ctx positions charged to the model, and its release. */
uint64_t residency_kv_bytes(const sched_model *sm, uint32_t n_ctx);
kv_cache *residency_kv_new(sched_model *sm, uint32_t n_ctx, corral_error *err);
void residency_kv_free(sched_model *sm, kv_cache **kv);
void residency_free_all(struct core *k);

/* session.c */
corral_status session_attach(struct core *k, sjob *sj, corral_error *err);
void session_detach(struct core *k, sjob *sj);
void session_swap_out(struct core *k, sched_session *ss);
void session_swap_in(struct core *k, sched_session *ss);
void session_free(struct core *k, sched_session *ss);
void session_expire(struct core *k);
size_t session_count(const struct core *k);
swap_session_key session_key(const sched_session *ss);
void session_save_all(struct core *k);

/* prepare.c */
/* Everything a Generate needs before its first step that depends only on the request and the
 * (resident) model: parameters, sanitizers, prompt ids, constraint. */
corral_status prepare_generate(struct core *k, sjob *sj, corral_error *err);
/* The reply to a Tokenize of a resident model. */
corral_status prepare_tokenize(struct core *k, sjob *sj, core_reply **out, corral_error *err);

/* batch.c */
/* Start a READY job: its cache (or its session's), its generator. CORRAL_OK, an error for the
 * client, or with *wait set CORRAL_RESOURCE_EXHAUSTED when memory cannot be found now. */
corral_status batch_start(struct core *k, sjob *sj, bool *wait, corral_error *err);
/* One step of sm's active jobs. */
void batch_step(struct core *k, sched_model *sm);
/* Size sm's batch arrays for the current configuration. */
corral_status batch_alloc(struct core *k, sched_model *sm, corral_error *err);
void batch_free(sched_model *sm);

/* sched.c: ending a job. Release what the core holds for it (and unlink it), then its final
 * event. */
void sched_finish_error(struct core *k, sjob *sj, corral_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void sched_finish_done(struct core *k, sjob *sj, core_stop stop);
/* The app counter of `app` (created when missing; NULL when out of memory). */
app_count *sched_app_counter(struct core *k, const char *app);

/* status.c */
void status_answer(struct core *k, job *j);
void status_answer_list(struct core *k, job *j);

#endif /* CORRAL_DAEMON_SCHED_IMPL_H */
