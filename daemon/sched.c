/*
 * sched.c — the core's compute thread: its interface (core.h), its loop, admission and the pick
 * rule.
 *
 * One loop iteration: take the inbox (new jobs, a reload); answer what needs no model (Status,
 * ListModels, Unload, Pin, Unpin) and admit the rest; end every job that was cancelled or ran out
 * of time; move jobs along (a model made resident, a request prepared, a prepared one started when
 * its model has a free active slot and memory for its cache); then run one step: the model whose
 * best runnable job has the highest class (among equals, the model stepped least recently) steps
 * its active jobs together (batch.c). A new urgent request therefore runs at the next step
 * boundary, while the others keep their KV state and resume afterwards. The thread sleeps on a
 * condition variable when nothing can run.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "corral/log.h"
#include "corral/version.h"
#include "sched_impl.h"

int64_t sched__mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t sched__unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- configurations -------------------------------------------------------------------------- */

static void config_unref(struct core *k, cfg_gen *g) {
    if (!g || --g->refs > 0 || g->first) return;
    for (cfg_gen **pp = &k->configs; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    cfg_gen_destroy(&g);
}

/* Make g the current configuration (its reference as current is taken over). */
static void config_install(struct core *k, cfg_gen *g) {
    g->refs = 1;
    g->next = k->configs;
    k->configs = g;
    cfg_gen *old = k->config;
    k->config = g;
    residency_sync(k, g->c);
    if (old) config_unref(k, old);
}

/* Read and check the file named in a reload request, and take it in. */
static void reload(struct core *k, const char *path) {
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    if (!c) {
        log_error("config reload failed; keeping the running configuration",
                  LOG_STR("error", err.message));
        return;
    }
    cfg_gen *g = cfg_gen_new(c, &err);
    if (!g) {
        log_error("configuration not reloaded: a sanitizer cannot be built",
                  LOG_STR("error", err.message));
        return;
    }
    config_install(k, g);
    log_info("configuration reloaded", LOG_STR("config", path), LOG_UINT("models", g->c->n_models),
             LOG_STR("note", "listen, limits and threads apply at the next start"));
}

/* ---- ending jobs ----------------------------------------------------------------------------- */

app_count *sched_app_counter(struct core *k, const char *app) {
    for (app_count *a = k->apps; a; a = a->next)
        if (strcmp(a->app, app) == 0) return a;
    app_count *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    snprintf(a->app, sizeof a->app, "%s", app);
    a->next = k->apps;
    k->apps = a;
    return a;
}

/* Release everything the core holds for sj, unlink it and free it. The job's final event must be
 * emitted right after (by the caller, from what it copied out first). */
static void sjob_release(struct core *k, sjob *sj) {
    for (sjob **pp = &k->jobs; *pp; pp = &(*pp)->next)
        if (*pp == sj) {
            *pp = sj->next;
            break;
        }
    gen_destroy(&sj->g);
    policy_gen_destroy(&sj->pg); /* after the generator that used it */
    if (sj->session)
        session_detach(k, sj);
    else if (sj->kv)
        residency_kv_free(sj->model, &sj->kv);
    /* Buffers in the model's arena must go before the model can. */
    free(sj->prompt);
    free(sj->generated);
    if (sj->counted) {
        if (sj->model) sj->model->n_queued--;
        app_count *a = sched_app_counter(k, sj->j->app);
        if (a && a->n) a->n--;
    }
    free(sj->sanitizer_report);
    config_unref(k, sj->gen);
    sj->j->core = NULL;
    free(sj);
}

void sched_finish_error(struct core *k, sjob *sj, corral_status code, const char *fmt, ...) {
    char message[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    job *j = sj->j;
    log_debug("request failed", LOG_UINT("id", j->id), LOG_STR("code", corral_status_name(code)),
              LOG_STR("message", message));
    sjob_release(k, sj);
    job_emit_error(j, code, "%s", message);
}

void sched_finish_done(struct core *k, sjob *sj, core_stop stop) {
    job *j = sj->j;
    core_done d = {.stop = stop,
                   .prompt_tokens = sj->n_prompt,
                   .prefilled_tokens = sj->n_prompt - sj->n_cached,
                   .generated_tokens = sj->n_generated,
                   .queue_us = sj->started_us - j->received_us,
                   .load_us = sj->load_us,
                   .prefill_us = sj->prefill_us,
                   .decode_us = sj->decode_us,
                   .total_us = sched__mono_us() - j->received_us,
                   .sanitizer_report = sj->sanitizer_report};
    snprintf(d.model, sizeof d.model, "%s", sj->model->name);
    sj->sanitizer_report = NULL; /* the event owns it now */
    sj->model->served++;
    k->served++;
    log_debug("generation done", LOG_UINT("id", j->id), LOG_STR("model", sj->model->name),
              LOG_UINT("prompt", d.prompt_tokens), LOG_UINT("prefilled", d.prefilled_tokens),
              LOG_UINT("generated", d.generated_tokens), LOG_UINT("reason", stop));
    sjob_release(k, sj);
    job_emit_done(j, &d);
}

/* ---- admission ------------------------------------------------------------------------------- */

/* The model a request names, checked against the config and the app's rights; NULL after
 * answering with the error. */
static sched_model *resolve_model(struct core *k, job *j, const char *name) {
    sched_model *sm = name[0] ? residency_find(k, name) : NULL;
    if (!sm || sm->removed) {
        job_emit_error(j, CORRAL_NOT_FOUND, "model '%s' is not configured", name);
        return NULL;
    }
    const cfg_app *app = cfg_find_app(core_cfg(k), j->app);
    if (!cfg_app_allows_model(app, sm->name)) {
        job_emit_error(j, CORRAL_PERMISSION_DENIED, "app '%s' may not use model '%s'", j->app,
                       sm->name);
        return NULL;
    }
    return sm;
}

/* Queue a job that needs sm; NULL (answered) when out of memory. */
static sjob *sjob_add(struct core *k, job *j, sched_model *sm, cfg_priority prio) {
    sjob *sj = calloc(1, sizeof *sj);
    if (!sj) {
        job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    sj->j = j;
    sj->model = sm;
    sj->priority = prio;
    sj->phase = SJOB_WAIT_MODEL;
    sj->gen = k->config;
    k->config->refs++;
    j->core = sj;
    sjob **pp = &k->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = sj;
    return sj;
}

static void admit_generate(struct core *k, job *j) {
    const core_generate *g = &j->req.generate;
    const bool has_prompt = g->prompt && g->prompt_len > 0;
    if (has_prompt == (g->n_messages > 0)) {
        job_emit_error(j, CORRAL_INVALID_ARGUMENT,
                       "give exactly one of prompt and messages (got %s)",
                       g->n_messages ? "both" : "neither");
        return;
    }
    for (size_t i = 0; i < g->n_messages; i++) {
        const char *role = g->messages[i].role;
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            job_emit_error(j, CORRAL_INVALID_ARGUMENT,
                           "message %zu has role '%s'; roles are system, user and assistant", i,
                           role);
            return;
        }
    }
    if (g->sanitizer[0] && !cfg_gen_profile(k->config, g->sanitizer)) {
        job_emit_error(j, CORRAL_NOT_FOUND, "sanitizer profile '%s' is not configured",
                       g->sanitizer);
        return;
    }
    sched_model *sm = resolve_model(k, j, g->model);
    if (!sm) return;
    cfg_priority prio = g->priority ? (cfg_priority)g->priority : sm->cfg->priority;
    const cfg_app *app = cfg_find_app(core_cfg(k), j->app);
    const cfg_priority ceiling = app ? app->max_priority : CFG_PRIORITY_INTERACTIVE;
    if (prio > ceiling) prio = ceiling;
    const cfg *c = core_cfg(k);
    if (sm->n_queued >= (uint32_t)c->queue_per_model) {
        job_emit_error(j, CORRAL_RESOURCE_EXHAUSTED,
                       "model '%s' has %u requests queued (limits.queue_per_model)", sm->name,
                       sm->n_queued);
        return;
    }
    app_count *ac = sched_app_counter(k, j->app);
    if (ac && ac->n >= (uint32_t)c->queue_per_app) {
        job_emit_error(j, CORRAL_RESOURCE_EXHAUSTED,
                       "app '%s' has %u requests queued (limits.queue_per_app)",
                       j->app[0] ? j->app : "(default)", ac->n);
        return;
    }
    sjob *sj = sjob_add(k, j, sm, prio);
    if (!sj) return;
    sm->n_queued++;
    if (ac) ac->n++;
    sj->counted = true;
}

static void answer_admin(struct core *k, job *j) {
    sched_model *sm = resolve_model(k, j, j->req.target.model);
    if (!sm) return;
    core_reply *r = core_reply_new(j->req.kind);
    if (!r) {
        job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    switch (j->req.kind) {
        case CORE_UNLOAD:
            if (residency_busy(k, sm)) {
                core_reply_destroy(&r);
                job_emit_error(j, CORRAL_FAILED_PRECONDITION,
                               "model '%s' has requests in flight; try again when they finish",
                               sm->name);
                return;
            }
            residency_release(k, sm, CORE_MODEL_UNLOADED);
            snprintf(r->message, sizeof r->message, "model '%s' unloaded", sm->name);
            break;
        case CORE_PIN:
            sm->pinned = true;
            snprintf(r->message, sizeof r->message, "model '%s' pinned", sm->name);
            break;
        case CORE_UNPIN:
            sm->pinned = false;
            snprintf(r->message, sizeof r->message, "model '%s' unpinned", sm->name);
            break;
        default:
            break;
    }
    job_emit_reply(j, r);
}

static void admit(struct core *k, job *j) {
    if (k->shutdown) {
        job_emit_error(j, CORRAL_UNAVAILABLE, "corrald is shutting down");
        return;
    }
    switch (j->req.kind) {
        case CORE_GENERATE:
            admit_generate(k, j);
            break;
        case CORE_STATUS:
            status_answer(k, j);
            break;
        case CORE_LIST_MODELS:
            status_answer_list(k, j);
            break;
        case CORE_TOKENIZE: {
            sched_model *sm = resolve_model(k, j, j->req.tokenize.model);
            if (sm) sjob_add(k, j, sm, CFG_PRIORITY_INTERACTIVE);
            break;
        }
        case CORE_LOAD: {
            sched_model *sm = resolve_model(k, j, j->req.target.model);
            if (sm) sjob_add(k, j, sm, CFG_PRIORITY_INTERACTIVE);
            break;
        }
        case CORE_UNLOAD:
        case CORE_PIN:
        case CORE_UNPIN:
            answer_admin(k, j);
            break;
        default:
            job_emit_error(j, CORRAL_INTERNAL, "the core cannot handle this request");
            break;
    }
}

/* ---- moving jobs along ----------------------------------------------------------------------- */

/* End jobs that were cancelled or ran out of time. */
static void reap(struct core *k) {
    const int64_t now = sched__mono_us();
    for (sjob *sj = k->jobs, *next; sj; sj = next) {
        next = sj->next;
        job *j = sj->j;
        const int why = atomic_load(&j->cancel);
        if (why != JOB_CANCEL_NONE) {
            if (why == JOB_CANCEL_SHUTDOWN || sj->phase != SJOB_ACTIVE) {
                sched_finish_error(
                    k, sj, why == JOB_CANCEL_SHUTDOWN ? CORRAL_UNAVAILABLE : CORRAL_CANCELLED,
                    why == JOB_CANCEL_SHUTDOWN  ? "corrald is shutting down"
                    : why == JOB_CANCEL_STALLED ? "the client stopped reading its "
                                                  "stream"
                                                : "cancelled before it started");
            } else {
                gen_token t;
                gen_finish(sj->g, GEN_STOP_NONE, &t);
                if (t.len) job_emit_text(j, t.text, t.len, -1);
                sched_finish_done(k, sj, CORE_STOP_CANCELLED);
            }
        } else if (sj->phase != SJOB_ACTIVE && sj->memory_wait_until_us &&
                   now > sj->memory_wait_until_us) {
            sched_finish_error(k, sj, CORRAL_RESOURCE_EXHAUSTED, "%s", sj->wait_reason);
        } else if (j->deadline_us && now > j->deadline_us) {
            sched_finish_error(k, sj, CORRAL_DEADLINE_EXCEEDED,
                               "deadline of %u ms passed while the request was %s",
                               j->req.generate.deadline_ms,
                               sj->phase != SJOB_ACTIVE         ? "queued"
                               : sj->n_prefilled < sj->n_prompt ? "reading the prompt"
                                                                : "generating");
        }
    }
}

/* A job found no memory: retry a little later, until its deadline (or limits.memory_wait_ms)
 * runs out; the message becomes its error then. */
static void wait_for_memory(struct core *k, sjob *sj, const char *reason) {
    const int64_t now = sched__mono_us();
    if (!sj->memory_wait_until_us)
        sj->memory_wait_until_us = sj->j->deadline_us
                                       ? sj->j->deadline_us
                                       : sj->j->received_us + core_cfg(k)->memory_wait_ms * 1000LL;
    sj->retry_at_us = now + SCHED_MEMORY_RETRY_US;
    const size_t len = strnlen(reason, sizeof sj->wait_reason - 1);
    memcpy(sj->wait_reason, reason, len);
    sj->wait_reason[len] = '\0';
}

/* A job whose model is resident: prepare it (Generate), or answer it (Tokenize, Load). */
static void model_ready(struct core *k, sjob *sj) {
    corral_error err;
    switch (sj->j->req.kind) {
        case CORE_GENERATE:
            if (prepare_generate(k, sj, &err) != CORRAL_OK) {
                sched_finish_error(k, sj, err.status, "%s", err.message);
                return;
            }
            sj->phase = SJOB_READY;
            sj->retry_at_us = 0;
            sj->memory_wait_until_us = 0;
            return;
        case CORE_TOKENIZE: {
            core_reply *r = NULL;
            if (prepare_tokenize(k, sj, &r, &err) != CORRAL_OK) {
                sched_finish_error(k, sj, err.status, "%s", err.message);
                return;
            }
            job *j = sj->j;
            sjob_release(k, sj);
            job_emit_reply(j, r);
            return;
        }
        case CORE_LOAD: {
            core_reply *r = core_reply_new(CORE_LOAD);
            job *j = sj->j;
            if (r)
                snprintf(r->message, sizeof r->message, "model '%s' is resident", sj->model->name);
            sjob_release(k, sj);
            if (r)
                job_emit_reply(j, r);
            else
                job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
            return;
        }
        default:
            sched_finish_error(k, sj, CORRAL_INTERNAL, "the core cannot handle this request");
            return;
    }
}

/* Jobs waiting for their model: load it, then prepare them. */
static void advance_waiting(struct core *k) {
    const int64_t now = sched__mono_us();
    for (sjob *sj = k->jobs, *next; sj; sj = next) {
        next = sj->next;
        if (sj->phase != SJOB_WAIT_MODEL || (sj->retry_at_us && now < sj->retry_at_us)) continue;
        sched_model *sm = sj->model;
        /* A changed entry: the old model goes when its requests end, then this one loads it. */
        if (sm->reload_pending) continue;
        corral_error err;
        int64_t load_us = 0;
        bool never = false;
        const corral_status st = residency_ensure_loaded(k, sm, &load_us, &never, &err);
        if (st == CORRAL_OK) {
            sj->load_us = load_us;
            model_ready(k, sj);
        } else if (st == CORRAL_RESOURCE_EXHAUSTED && !never) {
            wait_for_memory(k, sj, err.message);
        } else {
            sched_finish_error(k, sj, err.status, "%s", err.message);
        }
    }
}

/* Prepared jobs: start those whose model has a free active slot, best first. A job whose client
 * is not reading gives its slot up; realtime jobs always start (up to SCHED_MAX_REALTIME_EXTRA
 * beside the others). */
static void start_ready(struct core *k) {
    const cfg *c = core_cfg(k);
    const int64_t now = sched__mono_us();
    for (int prio = CFG_PRIORITY_REALTIME; prio >= CFG_PRIORITY_BACKGROUND; prio--) {
        for (sjob *sj = k->jobs, *next; sj; sj = next) {
            next = sj->next;
            if (sj->phase != SJOB_READY || (int)sj->priority != prio) continue;
            if (sj->retry_at_us && now < sj->retry_at_us) continue;
            if (atomic_load(&sj->j->paused)) continue;
            /* A session is used by one request at a time. */
            const char *sid = sj->j->req.generate.session;
            bool session_busy = false;
            for (sched_session *ss = k->sessions; sid[0] && ss && !session_busy; ss = ss->next)
                session_busy = strcmp(ss->id, sid) == 0 && ss->busy && ss->busy != sj;
            if (session_busy) continue;
            uint32_t active = 0, realtime = 0;
            for (const sjob *o = k->jobs; o; o = o->next)
                if (o->model == sj->model && o->phase == SJOB_ACTIVE &&
                    !atomic_load(&o->j->paused)) {
                    active++;
                    realtime += o->priority == CFG_PRIORITY_REALTIME;
                }
            const bool slot =
                active < (uint32_t)c->active_per_model ||
                (prio == CFG_PRIORITY_REALTIME && realtime < SCHED_MAX_REALTIME_EXTRA);
            if (!slot) continue;
            bool wait;
            corral_error err;
            if (batch_start(k, sj, &wait, &err) == CORRAL_OK) continue;
            if (wait)
                wait_for_memory(k, sj, err.message);
            else
                sched_finish_error(k, sj, err.status, "%s", err.message);
        }
    }
}

/* The model to step: the one whose best runnable job has the highest class; among equals, the
 * one stepped least recently. NULL when no job can run. */
static sched_model *pick(struct core *k) {
    sched_model *best = NULL;
    int best_prio = 0;
    for (const sjob *sj = k->jobs; sj; sj = sj->next) {
        if (sj->phase != SJOB_ACTIVE || atomic_load(&sj->j->paused)) continue;
        const int prio = (int)sj->priority;
        if (!best || prio > best_prio ||
            (prio == best_prio && sj->model->last_step_us < best->last_step_us)) {
            best = sj->model;
            best_prio = prio;
        }
    }
    return best;
}

/* ---- the thread ------------------------------------------------------------------------------ */

static void *sched_main(void *arg) {
    struct core *k = arg;
    mem_thread_init();
    for (;;) {
        pthread_mutex_lock(&k->mu);
        job *inbox = k->inbox_head;
        k->inbox_head = k->inbox_tail = NULL;
        char *reload_path = k->reload_path;
        k->reload_path = NULL;
        const bool quit = k->quit;
        const bool shutdown = k->shutdown;
        k->poked = false;
        pthread_mutex_unlock(&k->mu);
        if (quit) {
            free(reload_path);
            break;
        }
        if (reload_path) {
            reload(k, reload_path);
            free(reload_path);
        }
        for (job *j = inbox, *next; j; j = next) {
            next = j->inbox_next;
            j->inbox_next = NULL;
            admit(k, j);
        }
        if (shutdown)
            for (sjob *sj = k->jobs; sj; sj = sj->next)
                atomic_store(&sj->j->cancel, JOB_CANCEL_SHUTDOWN);
        reap(k);
        session_expire(k);
        residency_tick(k);
        advance_waiting(k);
        start_ready(k);

        sched_model *sm = pick(k);
        if (sm) {
            batch_step(k, sm);
            continue;
        }

        pthread_mutex_lock(&k->mu);
        k->idle = k->jobs == NULL && k->inbox_head == NULL;
        if (!k->inbox_head && !k->poked && !k->quit && !k->reload_path &&
            !(k->shutdown && k->jobs)) {
            /* Nothing can run: sleep until new work, a poke, or a periodic check (deadlines,
             * memory retries, session expiry, paused streams). */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            const long wait_ns = k->jobs ? 5000000L : 200000000L;
            until.tv_nsec += wait_ns;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&k->cv, &k->mu, &until);
        }
        pthread_mutex_unlock(&k->mu);
    }
    return NULL;
}

/* ---- the interface --------------------------------------------------------------------------- */

core *core_new(cfg *c, corral_error *err) {
    struct core *k = calloc(1, sizeof *k);
    if (!k) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_destroy(&c);
        return NULL;
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->started_us = sched__mono_us();
    k->started_ms = sched__unix_ms();
    k->initial = c;
    mem_thread_init(); /* preloads below allocate for models from this thread */
    cfg_gen *g = cfg_gen_new(c, err);
    if (!g) {
        k->initial = NULL;
        core_destroy(&k);
        return NULL;
    }
    g->first = true;
    swap_scan_report scan;
    k->swap = swap_dir_open(c->swap_dir, c->session_ttl_ms, &scan);
    if (!k->swap) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_gen_destroy(&g);
        core_destroy(&k);
        return NULL;
    }
    log_info("memory", LOG_F64("limit_mib", c->memory_limit / 1048576.0),
             LOG_F64("high_watermark", c->high_watermark),
             LOG_F64("low_watermark", c->low_watermark), LOG_STR("policy", c->evict_policy),
             LOG_STR("swap_dir", c->swap_dir), LOG_INT("swap_writable", swap_dir_writable(k->swap)),
             LOG_INT("exact_accounting", mem_accounting_exact()),
             LOG_UINT("temp_removed", scan.temp_removed), LOG_UINT("images_kept", scan.images_kept),
             LOG_UINT("images_removed", scan.images_removed));
    k->pool = threadpool_new((uint32_t)c->threads, err);
    if (!k->pool) {
        cfg_gen_destroy(&g);
        core_destroy(&k);
        return NULL;
    }
    config_install(k, g);
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        if (!sm->cfg->preload) continue;
        if (residency_ensure_loaded(k, sm, NULL, NULL, err) != CORRAL_OK) {
            core_destroy(&k);
            return NULL;
        }
    }
    if (pthread_create(&k->thread, NULL, sched_main, k) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot start the scheduler thread");
        core_destroy(&k);
        return NULL;
    }
    k->thread_started = true;
    return k;
}

const cfg *core_initial_config(const core *k) {
    return k->initial;
}

uint64_t core_uptime_ms(const core *k) {
    return (uint64_t)((sched__mono_us() - k->started_us) / 1000);
}

void core_submit(core *k, job *j) {
    j->inbox_next = NULL;
    pthread_mutex_lock(&k->mu);
    if (k->inbox_tail)
        k->inbox_tail->inbox_next = j;
    else
        k->inbox_head = j;
    k->inbox_tail = j;
    k->idle = false;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

void core_poke(core *k) {
    pthread_mutex_lock(&k->mu);
    k->poked = true;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

void core_reload(core *k, const char *path) {
    char *copy = strdup(path);
    if (!copy) {
        log_error("config reload failed: out of memory");
        return;
    }
    pthread_mutex_lock(&k->mu);
    free(k->reload_path);
    k->reload_path = copy;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

void core_shutdown(core *k) {
    pthread_mutex_lock(&k->mu);
    k->shutdown = true;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

int core_idle(core *k) {
    pthread_mutex_lock(&k->mu);
    const int idle = k->idle && !k->inbox_head;
    pthread_mutex_unlock(&k->mu);
    return idle;
}

void core_destroy(core **pk) {
    if (!pk || !*pk) return;
    struct core *k = *pk;
    if (k->thread_started) {
        pthread_mutex_lock(&k->mu);
        k->quit = true;
        pthread_cond_signal(&k->cv);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->thread, NULL);
    }
    /* Jobs still held (the front end gave up waiting at shutdown): release what the core owns
     * for them; the jobs themselves belong to their front ends. */
    while (k->jobs) sjob_release(k, k->jobs);
    /* Conversations survive a restart: their caches go to the swap directory, whose images the
     * next corrald picks up when the sessions continue. */
    session_save_all(k);
    residency_free_all(k);
    swap_dir_destroy(&k->swap);
    threadpool_destroy(&k->pool);
    for (app_count *a = k->apps, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    for (cfg_gen *g = k->configs, *next; g; g = next) {
        next = g->next;
        cfg_gen_destroy(&g);
    }
    free(k->reload_path);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
    *pk = NULL;
}
