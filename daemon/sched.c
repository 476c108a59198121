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
#include "dirlock.h"
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

void sched_config_unref(struct core *k, cfg_gen *g) {
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
    /* Front ends read the table on their own threads (core_auth_acquire). */
    pthread_mutex_lock(&k->mu);
    auth_table_release(&k->auth);
    k->auth = auth_table_ref(g->auth);
    pthread_mutex_unlock(&k->mu);
    residency_sync(k, g->c);
    if (old) sched_config_unref(k, old);
}

/* A reload: the file is read and its profiles built on the io actor, never on a front end's or
 * the compute thread (a slow or hostile file stalls neither). */
typedef struct reload_task {
    core_task t;
    char *path;
    size_t running_models; /* the running configuration's, for a sanity check */
    cfg_gen *gen;          /* the result */
    corral_error err;
} reload_task;

static void reload_run(actor_task *base) {
    reload_task *t = (reload_task *)base;
    /* The models it names are checked as at start (headers, templates, contexts): a reload that
     * would fail their every request is refused, and the running configuration kept. */
    cfg *c = cfg_load_file_report(t->path, NULL, cfg_check_models, &t->err);
    if (!c) return;
    if (c->n_models == 0 && t->running_models > 0) {
        /* An empty or truncated file reads as the built-in defaults: every model gone. */
        corral_error_set(&t->err, CORRAL_INVALID_ARGUMENT,
                         "%s configures no models (an empty or cut-off file?); the running "
                         "configuration serves %zu",
                         t->path, t->running_models);
        cfg_destroy(&c);
        return;
    }
    t->gen = cfg_gen_new(c, &t->err);
}

static void reload_finish(struct core *k, core_task *ct) {
    reload_task *t = (reload_task *)ct;
    if (!t->t.base.ran) {
        /* shutting down */
    } else if (!t->gen) {
        log_error("config reload failed; keeping the running configuration",
                  LOG_STR("config", t->path), LOG_STR("error", t->err.message));
    } else {
        config_install(k, t->gen);
        log_info("configuration reloaded", LOG_STR("config", t->path),
                 LOG_UINT("models", t->gen->c->n_models),
                 LOG_STR("note", "listen, limits, threads and auth.server_key_file apply at the "
                                 "next start"));
        t->gen = NULL;
    }
    cfg_gen_destroy(&t->gen);
    free(t->path);
    free(t);
}

static void reload(struct core *k, char *path) {
    reload_task *t = calloc(1, sizeof *t);
    if (!t) {
        log_error("config reload failed: out of memory");
        free(path);
        return;
    }
    actor_task_init(&t->t.base, reload_run, 0);
    t->t.finish = reload_finish;
    t->path = path;
    t->running_models = core_cfg(k)->n_models;
    sched_post(k, k->io, &t->t);
}

/* ---- tasks ----------------------------------------------------------------------------------- */

void sched_post(struct core *k, actor *a, core_task *t) {
    if (!a) {
        /* The actors are gone (shutdown): the task comes back unrun. */
        t->base.ran = false;
        t->finish(k, t);
        return;
    }
    k->tasks_in_flight++;
    actor_post(a, &t->base);
}

/* An actor's `done`: hand the task to the compute thread. Runs on the actor's thread. */
static void task_done(actor_task *base, void *ctx) {
    struct core *k = ctx;
    core_task *t = (core_task *)base;
    t->done_next = NULL;
    pthread_mutex_lock(&k->mu);
    if (k->done_tail)
        k->done_tail->done_next = t;
    else
        k->done_head = t;
    k->done_tail = t;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/* Take in the results of the tasks in the list. */
static void finish_tasks(struct core *k, core_task *list) {
    for (core_task *t = list, *next; t; t = next) {
        next = t->done_next;
        k->tasks_in_flight--;
        t->finish(k, t);
    }
}

/* ---- ending jobs ----------------------------------------------------------------------------- */

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
        /* An app's counter goes once idle: app names that came and went leave nothing behind. */
        apps_uncount(k, sj);
    }
    free(sj->sanitizer_report);
    sched_config_unref(k, sj->gen);
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
    /* (job_emit_error logs it, at warn.) */
    sjob_release(k, sj);
    job_emit_error(j, code, "%s", message);
}

void sched_finish_done(struct core *k, sjob *sj, core_stop stop) {
    job *j = sj->j;
    core_done d = {.stop = stop,
                   .prompt_tokens = sj->n_prompt,
                   .prefilled_tokens = sj->n_prompt - sj->n_cached,
                   .generated_tokens = sj->n_generated,
                   /* Waiting, the load it waited for apart (that is load_us). */
                   .queue_us = sj->started_us - j->received_us > sj->load_us
                                   ? sj->started_us - j->received_us - sj->load_us
                                   : 0,
                   .load_us = sj->load_us,
                   .prefill_us = sj->prefill_us,
                   .decode_us = sj->decode_us,
                   .total_us = sched__mono_us() - j->received_us,
                   .queue_steps = sj->queue_steps,
                   .dropped_messages = sj->dropped_messages,
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

void sched_finish_reply(struct core *k, sjob *sj, core_reply *reply) {
    job *j = sj->j;
    sjob_release(k, sj);
    job_emit_reply(j, reply);
}

void sched_fail_waiting(struct core *k, sched_model *sm, const corral_error *err) {
    for (sjob *sj = k->jobs, *next; sj; sj = next) {
        next = sj->next;
        if (sj->model == sm && sj->phase == SJOB_WAIT_MODEL)
            sched_finish_error(k, sj, err->status, "%s", err->message);
    }
}

/* ---- admission ------------------------------------------------------------------------------- */

/* The model a request names, checked against the config and the app's rights; NULL after
 * answering with the error. */
static sched_model *resolve_model(struct core *k, job *j, const char *name) {
    sched_model *sm = name[0] ? residency_find(k, name) : NULL;
    if (!sm || sm->removed) {
        status_model_not_found(k, j, name);
        return NULL;
    }
    return apps_allow_model(k, j, sm) ? sm : NULL;
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
    sj->entry = sm->cfg;
    sj->steps_at_receipt = k->steps;
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
        j->error_rule = JOB_RULE_SANITIZER_PROFILE;
        job_emit_error(j, CORRAL_NOT_FOUND, "sanitizer profile '%s' is not configured",
                       g->sanitizer);
        return;
    }
    sched_model *sm = resolve_model(k, j, g->model);
    if (!sm) return;
    cfg_priority prio;
    if (!apps_admit_generate(k, j, sm, &prio)) return;
    sjob *sj = sjob_add(k, j, sm, prio);
    if (!sj) return;
    sm->n_queued++;
    sj->counted = true;
    sj->token_cap = apps_rules(k, j).max_tokens;
    apps_count(k, sj);
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
        case CORE_UNLOAD: {
            /* A pin says "keep it": an unload that would quietly undo it is refused, naming
             * the pin and the two ways on. */
            const bool force = j->req.target.force;
            if (sm->pinned && !force) {
                core_reply_destroy(&r);
                job_emit_error(j, CORRAL_FAILED_PRECONDITION,
                               "model '%s' is pinned%s: unpin it first (corral unpin %s), or "
                               "unload it with --force",
                               sm->name, sm->cfg->pin ? " (pin: true in the config)" : "",
                               sm->name);
                return;
            }
            if (residency_busy(k, sm)) {
                core_reply_destroy(&r);
                job_emit_error(j, CORRAL_FAILED_PRECONDITION,
                               "model '%s' has requests in flight; try again when they finish",
                               sm->name);
                return;
            }
            const bool was_pinned = sm->pinned;
            sm->pinned = false;
            residency_unload(k, sm);
            snprintf(r->message, sizeof r->message, "model '%s' %sunloaded", sm->name,
                     was_pinned ? "unpinned and " : "");
            break;
        }
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
    if (!apps_admit(k, j)) return;
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
        case CORE_LOAD:
        case CORE_PIN: {
            /* A pin loads the model first: pinned and not resident would keep nothing. */
            sched_model *sm = resolve_model(k, j, j->req.target.model);
            if (sm) sjob_add(k, j, sm, CFG_PRIORITY_INTERACTIVE);
            break;
        }
        case CORE_UNLOAD:
        case CORE_UNPIN:
            answer_admin(k, j);
            break;
        default:
            job_emit_error(j, CORRAL_INTERNAL, "the core cannot handle this request");
            break;
    }
}

/* ---- moving jobs along ----------------------------------------------------------------------- */

/* End sj if it was cancelled or ran out of time. */
static void reap_one(struct core *k, sjob *sj, int64_t now) {
    job *j = sj->j;
    {
        const int why = atomic_load(&j->cancel);
        if (why != JOB_CANCEL_NONE) {
            /* Worth an info line: a client that vanished, stalled or went silent is something an
             * operator looks for, and the tests read it to tell a cancellation from an end. */
            log_info("request cancelled", LOG_UINT("id", j->id), LOG_STR("app", j->app),
                     LOG_STR("model", sj->model ? sj->model->name : ""),
                     LOG_STR("why", job_cancel_name((job_cancel)why)),
                     LOG_STR("when", sj->phase == SJOB_ACTIVE ? "running" : "queued"),
                     LOG_UINT("generated", sj->n_generated));
            if (why == JOB_CANCEL_SHUTDOWN || sj->phase != SJOB_ACTIVE) {
                sched_finish_error(
                    k, sj, why == JOB_CANCEL_SHUTDOWN ? CORRAL_UNAVAILABLE : CORRAL_CANCELLED,
                    why == JOB_CANCEL_SHUTDOWN  ? "corrald is shutting down"
                    : why == JOB_CANCEL_STALLED ? "the client stopped reading its stream"
                    : why == JOB_CANCEL_SILENT  ? "the client sent nothing for longer than "
                                                  "limits.peer_timeout_ms"
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

/* End jobs that were cancelled or ran out of time. */
static void reap(struct core *k) {
    const int64_t now = sched__mono_us();
    for (sjob *sj = k->jobs, *next; sj; sj = next) {
        next = sj->next;
        /* A task works on it (preparing, reading its session back): it ends when that is back. */
        if (sj->task) continue;
        job *j = sj->j;
        sched_model *sm = sj->model;
        const bool waited_for_model = sj->phase == SJOB_WAIT_MODEL;
        /* Its model broke under it (residency_break): what it holds of the model cannot serve. */
        if (sm && sm->broken && !waited_for_model) {
            sched_finish_error(k, sj, CORRAL_IO, "model '%s' is broken: %s", sm->name,
                               sm->broken_reason);
            continue;
        }
        const bool ends = atomic_load(&j->cancel) != JOB_CANCEL_NONE ||
                          (sj->phase != SJOB_ACTIVE && sj->memory_wait_until_us &&
                           now > sj->memory_wait_until_us) ||
                          (j->deadline_us && now > j->deadline_us);
        reap_one(k, sj, now);
        /* A load nobody waits for any more is cancelled. */
        if (ends && waited_for_model) residency_forget_load(k, sm);
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

/* A job whose model is resident: prepare it (Generate, Tokenize), or answer it (Load, Pin: a
 * pin takes effect once the model is in). */
static void model_ready(struct core *k, sjob *sj) {
    const core_kind kind = sj->j->req.kind;
    if (kind != CORE_LOAD && kind != CORE_PIN) {
        prepare_start(k, sj);
        return;
    }
    core_reply *r = core_reply_new(kind);
    if (!r) {
        sched_finish_error(k, sj, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    sched_model *sm = sj->model;
    if (kind == CORE_PIN) {
        sm->pinned = true;
        snprintf(r->message, sizeof r->message, "model '%s' is resident and pinned", sm->name);
    } else {
        snprintf(r->message, sizeof r->message, "model '%s' is resident", sm->name);
    }
    sched_finish_reply(k, sj, r);
}

/* Jobs waiting for their model: ask for it (one load for however many wait), and prepare those
 * whose model is resident. */
static void advance_waiting(struct core *k) {
    const int64_t now = sched__mono_us();
    for (sjob *sj = k->jobs, *next; sj; sj = next) {
        next = sj->next;
        if (sj->phase != SJOB_WAIT_MODEL || (sj->retry_at_us && now < sj->retry_at_us)) continue;
        corral_error err = {0};
        switch (residency_want(k, sj->model, &err)) {
            case RESIDENCY_READY:
                /* Its time includes the load it waited for. */
                if (sj->waited_for_load) sj->load_us = sj->model->load_us;
                sj->retry_at_us = 0;
                sj->memory_wait_until_us = 0;
                model_ready(k, sj);
                break;
            case RESIDENCY_PENDING:
                sj->waited_for_load = true;
                break;
            case RESIDENCY_NO_ROOM:
                wait_for_memory(k, sj, err.message);
                break;
            case RESIDENCY_NEVER_FITS:
                sj->j->error_rule = JOB_RULE_MEMORY_LIMIT;
                sched_finish_error(k, sj, err.status, "%s", err.message);
                break;
            case RESIDENCY_FAILED:
                sched_finish_error(k, sj, err.status, "%s", err.message);
                break;
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
                session_busy = strcmp(ss->id, sid) == 0 && strcmp(ss->app, sj->j->app) == 0 &&
                               ((ss->busy && ss->busy != sj) || ss->io);
            if (session_busy) continue;
            uint32_t active = 0, realtime = 0;
            for (const sjob *o = k->jobs; o; o = o->next)
                if (o->model == sj->model && o->phase == SJOB_ACTIVE &&
                    !atomic_load(&o->j->paused)) {
                    active++;
                    realtime += o->priority == CFG_PRIORITY_REALTIME;
                }
            /* A normal slot goes to an app within its share while other apps wait (apps.c);
             * realtime's extra slots to any realtime request. */
            const bool extra = prio == CFG_PRIORITY_REALTIME && realtime < SCHED_MAX_REALTIME_EXTRA;
            const bool slot = active < (uint32_t)c->active_per_model &&
                              apps_slot_fair(k, sj, (uint32_t)c->active_per_model);
            if (!slot && !extra) continue;
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
 * one stepped least recently. NULL when no job can run — or when a job of a higher class than any
 * runnable one is being prepared or is getting its session back: those tasks are short, and
 * stepping lower classes meanwhile would delay its first token by a step each. */
static sched_model *pick(struct core *k) {
    sched_model *best = NULL;
    int best_prio = 0, coming = 0;
    for (const sjob *sj = k->jobs; sj; sj = sj->next)
        if ((sj->phase == SJOB_PREPARING || sj->phase == SJOB_SESSION_IN) &&
            (int)sj->priority > coming)
            coming = (int)sj->priority;
    for (const sjob *sj = k->jobs; sj; sj = sj->next) {
        if (sj->phase != SJOB_ACTIVE || atomic_load(&sj->j->paused)) continue;
        const int prio = (int)sj->priority;
        if (!best || prio > best_prio ||
            (prio == best_prio && sj->model->last_step_us < best->last_step_us)) {
            best = sj->model;
            best_prio = prio;
        }
    }
    return best && best_prio >= coming ? best : NULL;
}

/* ---- the thread ------------------------------------------------------------------------------ */

/* Microseconds until some job must be looked at again though nothing wakes the thread: its
 * deadline, its next memory retry, or the end of its wait for memory; at most SCHED_TICK_US (model
 * keep-alives, session expiry). Polling every few milliseconds instead kept the compute thread at
 * a quarter of a core while a client's stream was paused. */
static int64_t next_wakeup_us(const struct core *k, int64_t now) {
    int64_t wait = SCHED_TICK_US;
    for (const sjob *sj = k->jobs; sj; sj = sj->next) {
        const int64_t times[3] = {sj->j->deadline_us, sj->retry_at_us, sj->memory_wait_until_us};
        for (int i = 0; i < 3; i++) {
            if (times[i] <= 0) continue;
            const int64_t left = times[i] > now ? times[i] - now : 0;
            if (left < wait) wait = left;
        }
    }
    /* A deadline is checked right after it passes. */
    return wait + 1000;
}

static void *sched_main(void *arg) {
    struct core *k = arg;
    mem_thread_init(MEM_THREAD_CORE);
    for (;;) {
        pthread_mutex_lock(&k->mu);
        job *inbox = k->inbox_head;
        k->inbox_head = k->inbox_tail = NULL;
        char *reload_path = k->reload_path;
        k->reload_path = NULL;
        core_task *done = k->done_head;
        k->done_head = k->done_tail = NULL;
        const bool quit = k->quit;
        const bool shutdown = k->shutdown;
        k->poked = false;
        pthread_mutex_unlock(&k->mu);
        if (quit) {
            free(reload_path);
            /* Put them back: core_destroy takes them in after the actors stop. */
            pthread_mutex_lock(&k->mu);
            if (done) {
                core_task *last = done;
                while (last->done_next) last = last->done_next;
                last->done_next = k->done_head;
                k->done_head = done;
                if (!k->done_tail) k->done_tail = last;
            }
            pthread_mutex_unlock(&k->mu);
            break;
        }
        finish_tasks(k, done);
        if (reload_path) reload(k, reload_path);
        for (job *j = inbox, *next; j; j = next) {
            next = j->inbox_next;
            j->inbox_next = NULL;
            admit(k, j);
        }
        if (shutdown)
            for (sjob *sj = k->jobs; sj; sj = sj->next)
                atomic_store(&sj->j->cancel, JOB_CANCEL_SHUTDOWN);
        reap(k);
        apps_tick(k);
        session_expire(k);
        residency_tick(k);
        advance_waiting(k);
        residency_report_progress(k);
        start_ready(k);
        residency_note_classes(k);

        sched_model *sm = pick(k);
        if (sm) {
            batch_step(k, sm);
            continue;
        }

        pthread_mutex_lock(&k->mu);
        k->idle = k->jobs == NULL && k->inbox_head == NULL && k->tasks_in_flight == 0;
        if (!k->inbox_head && !k->done_head && !k->poked && !k->quit && !k->reload_path &&
            !(k->shutdown && k->jobs)) {
            /* Nothing can run: sleep until new work, a poke (a front end cancelling, or
             * resuming a paused stream; an actor's task done), the next time a job must be
             * looked at, or the periodic check of keep-alives and session expiry. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            const long wait_ns = (long)next_wakeup_us(k, sched__mono_us()) * 1000L;
            until.tv_sec += wait_ns / 1000000000L;
            until.tv_nsec += wait_ns % 1000000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&k->cv, &k->mu, &until);
        }
        pthread_mutex_unlock(&k->mu);
    }
    mem_thread_exit();
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
    /* The caller is a front end's thread (preloads below allocate for models from it). */
    mem_thread_init(MEM_THREAD_FRONT);
    cfg_gen *g = cfg_gen_new(c, err);
    if (!g) {
        k->initial = NULL;
        core_destroy(&k);
        return NULL;
    }
    g->first = true;
    /* The directories this daemon writes are its alone: a second corrald on them stops here,
     * before its swap scan could clean the first one's images. */
    k->swap_lock = dirlock_take(c->swap_dir, "swap directory", err);
    if (k->swap_lock || err->status == CORRAL_OK)
        k->cache_lock = dirlock_take(c->cache_dir, "cache directory", err);
    if (err->status != CORRAL_OK) {
        cfg_gen_destroy(&g);
        core_destroy(&k);
        return NULL;
    }
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
    /* Merges on the loader use one thread: the compute threads keep serving meanwhile. */
    if (k->pool) k->loader_pool = threadpool_new(1, err);
    if (!k->pool || !k->loader_pool) {
        cfg_gen_destroy(&g);
        core_destroy(&k);
        return NULL;
    }
    config_install(k, g);
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        /* A pinned model is kept: it is loaded at start like one marked preload. */
        if (!sm->cfg->preload && !sm->cfg->pin) continue;
        if (residency_load_now(k, sm, err) != CORRAL_OK) {
            core_destroy(&k);
            return NULL;
        }
    }
    if (!(k->loader = actor_new("loader", task_done, k, err)) ||
        !(k->io = actor_new("io", task_done, k, err)) ||
        !(k->preparer = actor_new("preparer", task_done, k, err))) {
        core_destroy(&k);
        return NULL;
    }
    if (pthread_create(&k->thread, NULL, sched_main, k) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot start the scheduler thread");
        core_destroy(&k);
        return NULL;
    }
    k->thread_started = true;
    return k;
}

auth_table *core_auth_acquire(core *k) {
    pthread_mutex_lock(&k->mu);
    auth_table *t = auth_table_ref(k->auth);
    pthread_mutex_unlock(&k->mu);
    return t;
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
    /* The actors stop after what they are running (told to cut it short); what they hand back is
     * taken in here, with no actor left to post to. */
    actor *actors[] = {k->loader, k->io, k->preparer};
    for (size_t i = 0; i < sizeof actors / sizeof actors[0]; i++)
        if (actors[i]) actor_cancel_all(actors[i]);
    actor_destroy(&k->loader);
    actor_destroy(&k->io);
    actor_destroy(&k->preparer);
    for (;;) {
        pthread_mutex_lock(&k->mu);
        core_task *done = k->done_head;
        k->done_head = k->done_tail = NULL;
        pthread_mutex_unlock(&k->mu);
        if (!done) break;
        finish_tasks(k, done);
    }
    /* Jobs still held (the front end gave up waiting at shutdown): release what the core owns
     * for them; the jobs themselves belong to their front ends. */
    while (k->jobs) sjob_release(k, k->jobs);
    /* Conversations survive a restart: their caches go to the swap directory, whose images the
     * next corrald picks up when the sessions continue. */
    session_save_all(k);
    residency_free_all(k);
    swap_dir_destroy(&k->swap);
    dirlock_release(&k->swap_lock);
    dirlock_release(&k->cache_lock);
    threadpool_destroy(&k->pool);
    threadpool_destroy(&k->loader_pool);
    apps_free_all(k);
    auth_table_release(&k->auth);
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
