/*
 * sched_impl.h — the core's state, shared by the files that make up the scheduler (private to
 * daemon/). Everything here belongs to the compute thread unless a field says otherwise.
 *
 *   sched.c      the core's interface (core.h), the thread's loop, admission, the pick rule
 *   batch.c      one step: a batch of one model's jobs through one forward pass
 *   prepare.c    a Generate's parameters, sanitizers, prompt tokens and constraint (preparer)
 *   residency.c  models: loading (loader), swapping out and in, unloading, the budget's holders
 *   session.c    conversations kept between requests, their KV caches on disk and back (io)
 *   status.c     answers that describe the daemon: Status, ListModels (plain structs)
 *   config_gen.c configurations and their sanitizer profiles, kept while jobs use them
 *
 * Slow work runs on three actors (actor.h), each a thread of its own, so that the compute thread
 * never waits on I/O: the loader (model loads, LoRA merges, swap-ins of weights), io (session
 * images written and read, the config file read on SIGHUP) and the preparer (sanitizers,
 * tokenizing, constraints). A task's `run` works on what the compute thread handed over and
 * leaves alone until the task comes back; its `finish` runs on the compute thread, between
 * steps, and takes the results in.
 */
#ifndef CORRAL_DAEMON_SCHED_IMPL_H
#define CORRAL_DAEMON_SCHED_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "actor.h"
#include "auth.h"
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
#define SCHED_DEFAULT_MAX_TOKENS 256
/* How often a request that waits for memory tries again. */
#define SCHED_MEMORY_RETRY_US    50000
/* The longest the compute thread sleeps with nothing to do: keep-alives and session expiry are
 * checked this often. */
#define SCHED_TICK_US            200000
/* Realtime requests always start; this many may run beside a model's active_per_model others. */
#define SCHED_MAX_REALTIME_EXTRA 8

struct core;

/* A task of the core's actors: run on an actor, finished on the compute thread. */
typedef struct core_task {
    actor_task base;
    void (*finish)(struct core *k, struct core_task *t); /* takes the results in; frees t */
    struct core_task *done_next;                         /* the core's inbox of finished tasks */
} core_task;

/* Post t to actor a, to come back to the compute thread's inbox when done. */
void sched_post(struct core *k, actor *a, core_task *t);

/* ---- configurations ---------------------------------------------------------------------------
 */

/* One configuration with its sanitizer profiles built. Jobs admitted under it hold a reference,
 * so a reload never frees what a running job still reads; the generation is freed when it is no
 * longer current and its last job ends. */
typedef struct cfg_gen {
    cfg *c;
    policy_profile **profiles;
    size_t n_profiles;
    /* Who may act as which app (auth.h); front ends take references. */
    struct auth_table *auth;
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

/* A file a variant was made from (its base model, its adapters' files), as it was when the
 * variant was loaded: a change means the merged weights are stale. */
typedef struct residency_source {
    char *path;
    image_file_stamp stamp;
} residency_source;

typedef struct sched_model {
    char *name;
    const cfg_model *cfg; /* the entry of the current configuration */
    bool removed;         /* dropped from the config: no new requests; unloaded when idle */
    bool reload_pending;  /* its entry changed: unload when idle, next load uses the new one */
    core_model_state state;
    struct load_task *loading; /* the load in flight (state LOADING) */
    int load_waiter_class;     /* scratch of residency_note_classes */
    uint64_t reserved;         /* bytes reserved for that load until it is done, */
    uint64_t reserved_base;    /* beyond what the model held when it began */
    uint64_t restore_heap;     /* the most heap a swap-in of it took beyond what it kept */
    bool unload_requested;     /* Unload asked: the model goes as soon as it is idle */
    bool stale;                /* what it kept (swapped out) cannot serve: dropped before a load */
    bool was_swapped;          /* evicted, not unloaded: its next load counts as a swap-in */
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
    uint64_t loads;          /* loads and swap-ins started */
    uint64_t steps;          /* batch steps run */
    uint64_t step_sequences; /* the sequences in them, summed */
    mem_owner *owner;        /* its memory: a jemalloc arena and the weights' mapping */
    int64_t load_us;         /* how long the last load took */
    int64_t merge_us;        /* a variant's last merge: what losing its cached image would cost */
    uint64_t merges;         /* merges done for it (a cached image spares them) */
    char *weights_path;      /* the file mapped: cfg->path, or a variant's merged image */
    policy_vocab *pv;        /* its vocabulary for sanitizers and constraints (cached DFAs) */
    bool verified;           /* a variant's merged image was fully checked once */
    /* Its file failed under it (CORE_MODEL_BROKEN: residency_break): its parts go once no job
     * holds them; the next request loads it afresh. broken_reason says why (Status). */
    bool broken;
    char broken_reason[CORRAL_ERROR_MESSAGE_MAX];
    /* A variant's base and adapter files as they were at its load (default arena). */
    residency_source *sources;
    size_t n_sources;
    struct sjob **members; /* a batch step's jobs (batch.c), batch_cap of them */
    gen_batch_item *items; /* and their parts of the step's forward pass */
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
    bool io;         /* its cache is being written or read (io actor): hands off */
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
    SJOB_WAIT_MODEL = 0, /* admitted; its model is not resident yet (or is loading) */
    SJOB_PREPARING = 1,  /* on the preparer: sanitizers, prompt ids, constraint */
    SJOB_READY = 2,      /* prepared; waiting for an active slot and memory for its cache */
    SJOB_SESSION_IN = 3, /* its session's cache is being read back (io actor) */
    SJOB_ACTIVE = 4,     /* holds its cache and generator: stepped in batches */
} sjob_phase;

/* The core's state for one job (job->core). Allocated at admission, freed when it ends. */
typedef struct sjob {
    job *j;
    cfg_gen *gen;           /* the configuration it was admitted under (a reference) */
    const cfg_model *entry; /* its model's entry in that configuration */
    /* Its app's counter while it is counted (a Generate; apps.c). */
    struct app_count *counter;
    sched_model *model;
    sched_session *session;
    cfg_priority priority;
    sjob_phase phase;
    bool counted;           /* in the model's and app's queue totals */
    uint32_t token_cap;     /* its app's max_tokens (0: none), for a request naming none */
    bool waited_for_load;   /* its model was loaded for it (its Done counts the load) */
    uint64_t load_progress; /* the last progress of its model's load passed on to it */
    core_task *task;        /* a task in flight for it (PREPARING, SESSION_IN): it waits for it */
    core_reply *answer;     /* a Tokenize's reply, made by the preparer */
    /* Prepared (prepare.c). */
    gen_params params;
    uint32_t max_tokens;
    const policy_profile *profile;
    int32_t *prompt; /* prompt ids (whole prompt, session prefix included) */
    uint32_t n_prompt;
    uint32_t dropped_messages; /* a chat's oldest messages left out to fit the context */
    uint32_t chat_renders;     /* times its chat was rendered and tokenized to fit (logged) */
    uint32_t n_prefilled;      /* prompt ids run so far (counting the reused prefix) */
    uint32_t n_cached;         /* ids taken from the session's KV cache */
    int32_t *generated;        /* generated ids, for sessions */
    uint32_t n_generated, cap_generated;
    kv_cache *kv; /* the job's own cache, or its session's */
    generator *g;
    struct policy_gen *pg;  /* its output constraint (regex), or NULL */
    char *sanitizer_report; /* for Done; NULL when no profile ran */
    /* Timing. */
    int64_t started_us, load_us, prefill_us, decode_us;
    uint64_t steps_at_receipt;    /* core->steps when it was admitted */
    uint32_t queue_steps;         /* steps begun between admission and its own first one */
    bool stepped;                 /* it was in a step */
    int64_t last_step_us;         /* fairness among a model's jobs */
    int64_t retry_at_us;          /* waiting for memory: not before this */
    int64_t memory_wait_until_us; /* waiting for memory: give up at this time */
    char wait_reason[384];        /* waiting for memory: what holds it (the eventual error) */
    struct sjob *next;            /* core->jobs, arrival order */
} sjob;

/* ---- the core ---------------------------------------------------------------------------------
 */

/* An app's counters (apps.c): kept while it has requests in flight or its rate bucket is not full
 * again, dropped afterwards. */
typedef struct app_count {
    char app[64];
    uint32_t n;        /* its Generate requests in flight (waiting or running) */
    double tokens;     /* apps[].requests_per_minute: requests left in the burst */
    int64_t refill_us; /* when tokens was last topped up */
    uint64_t stamp;    /* fair shares: the walk that counted `tally` (core->apps_stamp) */
    uint32_t tally;    /* its requests on one model that the walk counted */
    struct app_count *next;
} app_count;

struct core {
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Protected by mu. */
    job *inbox_head, *inbox_tail;
    core_task *done_head, *done_tail; /* tasks the actors handed back */
    char *reload_path;                /* SIGHUP: the file to read */
    bool shutdown, quit, idle, poked;
    actor *loader;            /* loads, merges, swap-ins of weights */
    actor *io;                /* session images, config reloads */
    actor *preparer;          /* sanitizers, tokenizing, constraints */
    threadpool *loader_pool;  /* the loader's threads for merges */
    uint32_t tasks_in_flight; /* compute thread: posted, not finished */
    /* Compute thread only. */
    threadpool *pool; /* compute threads shared by every model (one batch at a time) */
    swap_dir *swap;   /* where session caches go when memory is needed */
    struct dirlock *swap_lock, *cache_lock; /* this daemon's alone (dirlock.h) */
    cfg_gen *config;                        /* the current configuration */
    cfg_gen *configs; /* every generation still held (the current one among them) */
    const cfg *initial;
    sched_model *models;
    sched_session *sessions;
    sjob *jobs; /* every job that needs a model, arrival order */
    app_count *apps;
    /* Counters in `apps`, read by any thread (tests of idle dropping); the last walk that tallied
     * requests per app (apps.c); the current configuration's auth table, protected by mu
     * (core_auth_acquire). */
    atomic_size_t n_apps;
    /* The highest class of the work the compute thread has in hand (jobs being prepared, ready,
     * or running and read; 0: none), set by it every turn and read by the loader, which steps
     * aside for realtime work (residency_note_classes). */
    atomic_int compute_class;
    uint64_t apps_stamp;
    auth_table *auth;
    int64_t started_us, started_ms;
    uint64_t served;
    uint64_t steps; /* batch steps begun, over all models */
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
/* What residency_want found. */
typedef enum residency_state {
    RESIDENCY_READY = 0,      /* resident */
    RESIDENCY_PENDING = 1,    /* a load is in flight, or room is being made for one: wait */
    RESIDENCY_NO_ROOM = 2,    /* memory is held by requests in use: wait and try again (err says by
                                 whom) */
    RESIDENCY_FAILED = 3,     /* err says why (a bad entry, an unreadable file...) */
    RESIDENCY_NEVER_FITS = 4, /* more than memory.limit can ever hold: err says by how much */
} residency_state;
/* Ask for sm to become resident; starts its load (on the loader) when it is not. */
residency_state residency_want(struct core *k, sched_model *sm, corral_error *err);
/* Load sm on the calling thread (preloads at start). */
corral_status residency_load_now(struct core *k, sched_model *sm, corral_error *err);
/* Pass the progress of the loads in flight on to the jobs waiting for them (those that want it),
 * when it moved since their last report. */
void residency_report_progress(struct core *k);
/* Tell the loader the classes it weighs (compute thread, every turn): the highest class of the
 * work in hand (core.compute_class) and of the jobs each load in flight serves. A load that
 * serves no realtime request pauses between tensors while realtime work is in hand, so that a
 * merge, quantization or repack does not take a share of the cores from a voice command. */
void residency_note_classes(struct core *k);
/* Cancel sm's load in flight when no job waits for it any more. */
void residency_forget_load(struct core *k, sched_model *sm);
/* Release a resident model's weights to make room (SWAPPED: they come back by mmap). */
void residency_swap_out(struct core *k, sched_model *sm);
/* Free everything a model holds (runner, vocabulary, model, arena); its sessions' caches must
 * be out of memory. */
void residency_drop(sched_model *sm);
bool residency_kept(const sched_model *sm);
bool residency_busy(const struct core *k, const sched_model *sm);
uint64_t residency_model_bytes(const sched_model *sm);
uint64_t residency_total_bytes(const struct core *k);
/* Make `need` more bytes fit (budget.c); `protect` is never evicted. Evictions that write (session
 * caches) are started on the io actor. Returns the budget's verdict; err names the holders for
 * BUDGET_FULL and the limit for BUDGET_NEVER. */
budget_verdict residency_make_room(struct core *k, uint64_t need, const sched_model *protect,
                                   corral_error *err);
/* Housekeeping between steps: keep-alives, removed, changed, broken and unloaded models. */
void residency_tick(struct core *k);
/* sm's file failed under it (a fault reading its weights, or its file changed in place): mark it
 * broken with `why` (logged, shown by Status). Its requests past waiting for the model end with
 * an Error CORRAL_IO naming why (reap: those in a task when it comes back); its sessions' caches
 * are dropped; its parts go once no job holds them; the next request loads it afresh, and a load
 * that fails keeps it broken with the load's error. Idempotent. */
void residency_break(struct core *k, sched_model *sm, const char *why);
/* Unload sm (Unload request): CORRAL_FAILED_PRECONDITION while requests use it. The weights go
 * at once; the rest once its sessions' caches are written out. */
corral_status residency_unload(struct core *k, sched_model *sm);
/* A KV cache of n_ctx positions charged to the model, and its release. */
uint64_t residency_kv_bytes(const sched_model *sm, uint32_t n_ctx);
kv_cache *residency_kv_new(sched_model *sm, uint32_t n_ctx, corral_error *err);
void residency_kv_free(sched_model *sm, kv_cache **kv);
void residency_free_all(struct core *k);

/* session.c */
/* The refusal of another app's session (its argument: the id). It does not say whose it is. */
#define SESSION_DENIED_FMT \
    "session '%s' belongs to another app: a session is private to the app that made it"
/* Whether the session `id` belongs to an app other than `app`: another app's session of that id
 * is in memory or an earlier corrald's image of it is on disk, and `app` has none of its own (a
 * pair left by an older corrald, whose ids were per app, keeps serving each). */
bool session_of_another_app(struct core *k, const char *id, const char *app);
/* Attach sj to its session, made when new; PERMISSION_DENIED (logged) when the id is another
 * app's (session_of_another_app: it became so after sj was admitted). */
corral_status session_attach(struct core *k, sjob *sj, corral_error *err);
void session_detach(struct core *k, sjob *sj);
/* Write an idle session's cache out (io actor) and free it when written. */
void session_start_swap_out(struct core *k, sched_session *ss);
/* Read a swapped session's cache back into ss->kv (io actor); sj waits (SESSION_IN) and
 * batch_finish_start is called when it is in. */
void session_start_swap_in(struct core *k, sched_session *ss, sjob *sj);
/* Write a session's cache out on the calling thread (shutdown). */
void session_swap_out_now(struct core *k, sched_session *ss);
void session_free(struct core *k, sched_session *ss);
void session_expire(struct core *k);
size_t session_count(const struct core *k);
/* Whether any of sm's sessions has its cache in memory or in flight. */
bool session_any_in_memory(const struct core *k, const sched_model *sm);
swap_session_key session_key(const sched_session *ss);
void session_save_all(struct core *k);

/* prepare.c */
/* Prepare sj on the preparer (SJOB_PREPARING): a Generate's parameters, sanitizers, prompt ids
 * and constraint, or a Tokenize's reply. When it comes back the job is READY, answered or
 * failed. */
void prepare_start(struct core *k, sjob *sj);

/* batch.c */
/* Start a READY job: its cache (or its session's), its generator. CORRAL_OK (ACTIVE, or
 * SESSION_IN while its session's cache is read back), an error for the client, or with *wait set
 * CORRAL_RESOURCE_EXHAUSTED when memory cannot be found now. */
corral_status batch_start(struct core *k, sjob *sj, bool *wait, corral_error *err);
/* The rest of a start once the job's cache holds its session's positions: prefix reuse, the
 * generator. Ends the job with an error when it fails. */
void batch_finish_start(struct core *k, sjob *sj);
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
void sched_finish_reply(struct core *k, sjob *sj, core_reply *reply);

/* Drop a job's or task's reference to a configuration generation. */
void sched_config_unref(struct core *k, cfg_gen *g);

/* The jobs waiting for sm's load fail with err (a load that failed). */
void sched_fail_waiting(struct core *k, sched_model *sm, const corral_error *err);

/* apps.c: the per-app rules, counters and fair shares (see its opening comment). Every
 * apps_admit* and apps_allow_model answers the job (an error) when it returns false. */
typedef struct app_rules {
    const cfg_app *app;   /* its entry; NULL for the owner, the default app, unlisted names */
    bool owner;           /* corrald's owner acting as itself: no limits */
    const char *name;     /* for messages: the app, or "(default)" */
    cfg_priority ceiling; /* the highest class it may ask for */
    bool admin;           /* may Load, Unload, Pin, Unpin */
    uint32_t max_concurrent, per_minute, max_tokens; /* 0: no limit */
} app_rules;
app_rules apps_rules(const struct core *k, const job *j);
/* Refuse j with PERMISSION_DENIED (message from fmt) and log the rule, the app and the model;
 * rule (a string literal) is kept in j->error_rule for the front ends. */
void apps_deny(job *j, const char *rule, const char *model, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The log line of a refusal, for a refusal answered otherwise than by apps_deny. */
void apps_log_denial(const job *j, const char *rule, const char *model);
/* What every request but Status and ListModels passes first: the rate, admin operations. */
bool apps_admit(struct core *k, job *j);
/* Whether j's app may use sm. */
bool apps_allow_model(struct core *k, job *j, const sched_model *sm);
/* Whether j's app may see model (Status, ListModels show only the models it may use). */
bool apps_allows_model_name(const struct core *k, const job *j, const char *model);
/* A Generate's rules on sm: its class (*prio: refused above the ceiling), max_tokens, its
 * session (another app's is refused), max_concurrent, limits.queue_per_app, and the model queue's
 * share (which may end another app's waiting request to make room). */
bool apps_admit_generate(struct core *k, job *j, sched_model *sm, cfg_priority *prio);
/* A Generate is counted (admitted), or uncounted (it ended). */
void apps_count(struct core *k, sjob *sj);
void apps_uncount(struct core *k, sjob *sj);
/* Whether sj may take one of sm's `slots` normal active slots now: false while its app runs its
 * share and another app's request of at least its class is ready. */
bool apps_slot_fair(struct core *k, const sjob *sj, uint32_t slots);
/* Drop counters that went idle (between steps). */
void apps_tick(struct core *k);
void apps_free_all(struct core *k);

/* status.c */
void status_answer(struct core *k, job *j);
void status_answer_list(struct core *k, job *j);
/* Answer j with NOT_FOUND for the model `name`, listing the configured models j's app may use
 * ("model 'x' is not configured; configured: a, b"), so that a typo shows what was meant. */
void status_model_not_found(struct core *k, job *j, const char *name);

#endif /* CORRAL_DAEMON_SCHED_IMPL_H */
