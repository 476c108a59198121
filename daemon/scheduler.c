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
#include <time.h>
#include <unistd.h>

#include "corral/chat.h"
#include "corral/log.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"
#include "corral/version.h"

enum {
    MODEL_UNLOADED = CORRAL__V1__MODEL_STATE__MODEL_STATE_UNLOADED,
    MODEL_LOADING = CORRAL__V1__MODEL_STATE__MODEL_STATE_LOADING,
    MODEL_RESIDENT = CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT,
};

#define DEFAULT_MAX_TOKENS 256
#define DEFAULT_CONTEXT_CAP 4096

typedef struct sched_model {
    char *name;
    const cfg_model *cfg;  /* the current configuration entry */
    bool removed;          /* dropped from the config: no new requests; unloaded when idle */
    bool reload_pending;   /* its entry changed: unload when idle, next load uses the new one */
    int state;
    model *m;
    model_runner *runner;
    uint32_t context;      /* KV positions per sequence */
    chat_template tmpl;
    bool pinned;
    uint32_t n_queued;     /* jobs counted against queue_per_model (waiting or running) */
    uint32_t n_active;     /* jobs holding KV state and taking turns */
    uint32_t n_sessions;
    uint64_t served;
    int64_t last_used_ms;  /* Unix time */
    uint64_t swap_ins, swap_outs;
    struct sched_model *next;
} sched_model;

typedef struct sched_session {
    char id[128];
    char app[64];
    sched_model *model;
    kv_cache *kv;
    int32_t *tokens;       /* the ids whose keys and values are in kv, in order */
    uint32_t n_tokens, cap_tokens;
    job *busy;             /* the job using it, or NULL */
    int64_t last_used_us;
    struct sched_session *next;
} sched_session;

typedef struct app_count {
    char app[64];
    uint32_t n;
    struct app_count *next;
} app_count;

typedef struct cfg_keep {
    cfg *c;
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
    cfg *config;
    cfg_keep *old_configs;
    sched_model *models;
    sched_session *sessions;
    job *jobs;             /* Generate jobs, arrival order */
    app_count *apps;
    int64_t started_ms;
    uint64_t served;
};

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

/* ---- outbox ----------------------------------------------------------------------------------- */

/* Pack resp for j's peer and queue it; final marks the job's last message. */
static void emit(sched *s, job *j, Corral__V1__Response *resp, bool final) {
    resp->id = j->id;
    outmsg *m = calloc(1, sizeof *m);
    size_t len = corral__v1__response__get_packed_size(resp);
    uint8_t *data = malloc(len ? len : 1);
    if (!m || !data) {
        /* Out of memory: the message is lost; a final one must still free the job. */
        log_error("out of memory queueing a response", LOG_UINT("id", j->id));
        free(data);
        if (!m) return;
        len = 0;
    } else {
        corral__v1__response__pack(resp, data);
    }
    m->job = j;
    m->data = data;
    m->len = data ? len : 0;
    m->final = final;
    pthread_mutex_lock(&s->mu);
    if (s->out_tail) s->out_tail->next = m;
    else s->out_head = m;
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

/* ---- models ----------------------------------------------------------------------------------- */

static sched_model *model_find(sched *s, const char *name) {
    for (sched_model *m = s->models; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

static void model_unload(sched *s, sched_model *sm) {
    /* Sessions hold KV caches of the model: they go with it. */
    for (sched_session **pp = &s->sessions; *pp;) {
        sched_session *ss = *pp;
        if (ss->model == sm && !ss->busy) {
            *pp = ss->next;
            kv_cache_destroy(&ss->kv);
            free(ss->tokens);
            free(ss);
            sm->n_sessions--;
        } else {
            pp = &ss->next;
        }
    }
    model_runner_destroy(&sm->runner);
    model_destroy(&sm->m);
    if (sm->state != MODEL_UNLOADED) log_info("model unloaded", LOG_STR("model", sm->name));
    sm->state = MODEL_UNLOADED;
    sm->reload_pending = false;
}

static corral_status model_ensure_loaded(sched *s, sched_model *sm, int64_t *load_us,
                                         corral_error *err) {
    if (sm->state == MODEL_RESIDENT) return CORRAL_OK;
    const int64_t t0 = mono_us();
    sm->state = MODEL_LOADING;
    model *m = model_load(sm->cfg->path, NULL, err);
    if (!m) {
        sm->state = MODEL_UNLOADED;
        return corral_error_prefix(err, "model '%s'", sm->name);
    }
    const model_hparams *hp = model_get_hparams(m);
    uint32_t ctx = (uint32_t)sm->cfg->context;
    if (ctx == 0) ctx = hp->n_ctx_train < DEFAULT_CONTEXT_CAP ? hp->n_ctx_train : DEFAULT_CONTEXT_CAP;
    if (ctx > hp->n_ctx_train) {
        model_destroy(&m);
        sm->state = MODEL_UNLOADED;
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "model '%s': configured context %u exceeds the model's %u",
                                sm->name, ctx, hp->n_ctx_train);
    }
    model_runner *r = model_runner_new(m, (uint32_t)s->config->prefill_chunk, s->pool, err);
    if (!r) {
        model_destroy(&m);
        sm->state = MODEL_UNLOADED;
        return corral_error_prefix(err, "model '%s'", sm->name);
    }
    chat_template tmpl = prompt_file_chat_template(model_get_gguf(m));
    if (sm->cfg->chat_template) {
        corral_error why;
        tmpl = chat_template_from_name(sm->cfg->chat_template, &why);
        if (tmpl == CHAT_TEMPLATE_UNKNOWN) {
            model_runner_destroy(&r);
            model_destroy(&m);
            sm->state = MODEL_UNLOADED;
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "model '%s': %s", sm->name,
                                    why.message);
        }
    }
    sm->m = m;
    sm->runner = r;
    sm->context = ctx;
    sm->tmpl = tmpl;
    sm->state = MODEL_RESIDENT;
    const int64_t took = mono_us() - t0;
    if (load_us) *load_us = took;
    log_info("model loaded", LOG_STR("model", sm->name), LOG_STR("path", sm->cfg->path),
             LOG_STR("arch", hp->arch), LOG_UINT("context", ctx),
             LOG_STR("template", chat_template_name(tmpl)), LOG_F64("ms", took / 1000.0));
    return CORRAL_OK;
}

/* Memory a model holds: mapped weights, scratch and the KV caches of its sessions and jobs. */
static uint64_t model_bytes(sched *s, const sched_model *sm) {
    if (sm->state != MODEL_RESIDENT) return 0;
    uint64_t bytes = model_weight_bytes(sm->m);
    for (sched_session *ss = s->sessions; ss; ss = ss->next)
        if (ss->model == sm) bytes += kv_cache_bytes(ss->kv);
    for (job *j = s->jobs; j; j = j->next)
        if (j->model == sm && j->kv && !j->session) bytes += kv_cache_bytes(j->kv);
    return bytes;
}

/* Bring the model list in line with config c (at start and on reload). */
static void models_sync(sched *s, cfg *c) {
    for (sched_model *sm = s->models; sm; sm = sm->next) {
        const cfg_model *entry = cfg_find_model(c, sm->name);
        if (!entry) {
            sm->removed = true;
            continue;
        }
        if (sm->cfg && (strcmp(sm->cfg->path, entry->path) != 0 ||
                        sm->cfg->context != entry->context || sm->cfg->kv_f32 != entry->kv_f32 ||
                        (sm->cfg->chat_template == NULL) != (entry->chat_template == NULL) ||
                        (entry->chat_template &&
                         strcmp(sm->cfg->chat_template, entry->chat_template) != 0)))
            sm->reload_pending = sm->state == MODEL_RESIDENT;
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

/* ---- sessions --------------------------------------------------------------------------------- */

static void session_free(sched *s, sched_session *ss) {
    for (sched_session **pp = &s->sessions; *pp; pp = &(*pp)->next)
        if (*pp == ss) {
            *pp = ss->next;
            break;
        }
    if (ss->model) ss->model->n_sessions--;
    kv_cache_destroy(&ss->kv);
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
        if (!ss->busy && now - ss->last_used_us > s->config->session_ttl_ms * 1000) {
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

/* ---- per-app accounting ------------------------------------------------------------------------ */

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

/* ---- finishing jobs ---------------------------------------------------------------------------- */

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
    if (j->session) {
        sched_session *ss = j->session;
        /* The session keeps what is in its cache: prompt ids, then generated ids, as far as the
         * cache holds them (the last sampled token was never run). */
        uint32_t n = kv_cache_n_pos(ss->kv);
        uint32_t total = j->n_prompt + j->n_generated;
        if (n > total) n = total;
        if (n > ss->cap_tokens) {
            int32_t *grown = realloc(ss->tokens, n * sizeof *grown);
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
        j->session = NULL;
        j->kv = NULL;
    } else {
        kv_cache_destroy(&j->kv);
    }
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

/* ---- starting a Generate ----------------------------------------------------------------------- */

/* Merge request, model defaults and engine defaults into generation parameters; validate. */
static corral_status build_params(const job *j, const sched_model *sm, gen_params *gp,
                                  uint32_t *max_tokens, corral_error *err) {
    const Corral__V1__Generate *g = j->req->generate;
    const cfg_sampling *d = &sm->cfg->defaults;
    *gp = gen_params_default();
    sampler_params *sp = &gp->sampling;
#define PICK(field, req_field, cfg_field, cast)                                                    \
    do {                                                                                           \
        if (g->req_field) sp->field = (cast)g->req_field->value;                                   \
        else if (d->has_##cfg_field) sp->field = (cast)d->cfg_field;                               \
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
    sp->seed = g->seed ? g->seed->value
                       : ((uint64_t)mono_us() * 0x9E3779B97F4A7C15ull) ^ (j->id << 17) ^ j->received_us;
    corral_status st = sampler_validate_params(sp, err);
    if (st != CORRAL_OK) return st;
    uint64_t mt = g->max_tokens ? g->max_tokens->value
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

/* Tokenize the request's prompt or chat for the model. */
static corral_status tokenize_request(const job *j, const sched_model *sm, int32_t **ids,
                                      size_t *n, corral_error *err) {
    const Corral__V1__Generate *g = j->req->generate;
    const tokenizer *tok = model_get_tokenizer(sm->m);
    if (g->n_messages == 0) return prompt_tokenize_text(tok, g->prompt, strlen(g->prompt), ids, n, err);
    chat_template tmpl = sm->tmpl;
    if (g->template_[0]) {
        tmpl = chat_template_from_name(g->template_, err);
        if (tmpl == CHAT_TEMPLATE_UNKNOWN) return err->status = CORRAL_INVALID_ARGUMENT;
    }
    chat_message *msgs = malloc(g->n_messages * sizeof *msgs);
    if (!msgs) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < g->n_messages; i++)
        msgs[i] = (chat_message){.role = g->messages[i]->role, .content = g->messages[i]->content};
    corral_status st = prompt_tokenize_chat(tok, tmpl, msgs, g->n_messages, ids, n, err);
    free(msgs);
    return st;
}

/* Find or create the job's session; checks ownership and the model. */
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
            ss->model->n_sessions--;
            kv_cache_destroy(&ss->kv);
            ss->n_tokens = 0;
            ss->model = NULL;
        }
        if (!ss->model) {
            ss->model = j->model;
            j->model->n_sessions++;
        }
        j->session = ss;
        return CORRAL_OK;
    }
    if (strlen(id) >= sizeof(((sched_session *)0)->id))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "session id longer than 127 bytes");
    sched_session *ss = calloc(1, sizeof *ss);
    if (!ss) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    snprintf(ss->id, sizeof ss->id, "%s", id);
    snprintf(ss->app, sizeof ss->app, "%s", j->app);
    ss->model = j->model;
    ss->last_used_us = mono_us();
    j->model->n_sessions++;
    ss->next = s->sessions;
    s->sessions = ss;
    j->session = ss;
    return CORRAL_OK;
}

/* Everything before the first compute step: model, parameters, prompt, cache, generator. */
static corral_status job_start(sched *s, job *j, corral_error *err) {
    sched_model *sm = j->model;
    j->started_us = mono_us();
    corral_status st = model_ensure_loaded(s, sm, &j->load_us, err);
    if (st != CORRAL_OK) return st;
    gen_params gp;
    uint32_t max_tokens = 0;
    if ((st = build_params(j, sm, &gp, &max_tokens, err)) != CORRAL_OK) return st;
    size_t n_prompt = 0;
    if ((st = tokenize_request(j, sm, &j->prompt, &n_prompt, err)) != CORRAL_OK) return st;
    if (n_prompt == 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the prompt is empty and model '%s' adds no BOS token", sm->name);
    if (n_prompt >= sm->context)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the prompt has %zu tokens; the context of model '%s' holds %u",
                                n_prompt, sm->name, sm->context);
    j->n_prompt = (uint32_t)n_prompt;
    j->cap_generated = max_tokens;
    j->generated = malloc(max_tokens * sizeof *j->generated);
    if (!j->generated) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");

    const kv_type kvt = sm->cfg->kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16;
    if (j->req->generate->session[0]) {
        if ((st = session_attach(s, j, err)) != CORRAL_OK) return st;
        sched_session *ss = j->session;
        if (!ss->kv && !(ss->kv = kv_cache_new(sm->m, sm->context, kvt, err))) return err->status;
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
    } else {
        /* A cache just big enough for this request. */
        uint32_t need = j->n_prompt + max_tokens;
        if (need > sm->context) need = sm->context;
        if (!(j->kv = kv_cache_new(sm->m, need, kvt, err))) return err->status;
    }
    j->gen = gen_new(sm->m, sm->runner, j->kv, &gp, err);
    if (!j->gen) return err->status;
    j->started = true;
    sm->last_used_ms = unix_ms();
    return CORRAL_OK;
}

/* ---- one step ----------------------------------------------------------------------------------- */

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

static void job_step(sched *s, job *j) {
    corral_error err = {0};
    if (!j->started) {
        if (job_start(s, j, &err) != CORRAL_OK) {
            finish_error(s, j, err.status, "%s", err.message);
            return;
        }
    }
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

/* ---- quick requests ----------------------------------------------------------------------------- */

static void fill_model_status(sched *s, sched_model *sm, Corral__V1__ModelStatus *ms) {
    corral__v1__model_status__init(ms);
    ms->name = sm->name;
    ms->state = (Corral__V1__ModelState)sm->state;
    ms->bytes = model_bytes(s, sm);
    ms->last_used_ms = (uint64_t)sm->last_used_ms;
    ms->queue_depth = sm->n_queued - sm->n_active;
    ms->active = sm->n_active;
    ms->requests_served = sm->served;
    ms->pinned = sm->pinned;
    ms->sessions = sm->n_sessions;
    ms->swap_ins = sm->swap_ins;
    ms->swap_outs = sm->swap_outs;
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
        total += model_bytes(s, sm);
        active += sm->n_active;
        queued += sm->n_queued - sm->n_active;
        if (want[0] && strcmp(want, sm->name) != 0) continue;
        fill_model_status(s, sm, &items[k]);
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
        const char *tn = sm->state == MODEL_RESIDENT ? chat_template_name(sm->tmpl)
                                                     : sm->cfg->chat_template;
        mi->chat_template = (char *)(tn ? tn : "");
        mi->state = (Corral__V1__ModelState)sm->state;
        mi->pinned = sm->pinned;
        ptrs[k++] = mi;
    }
    Corral__V1__ModelList list = CORRAL__V1__MODEL_LIST__INIT;
    list.n_models = k;
    list.models = ptrs;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.body_case = CORRAL__V1__RESPONSE__BODY_MODELS;
    r.models = &list;
    emit(s, j, &r, true);
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
    if (st == CORRAL_OK && !pieces) st = corral_error_set(&err, CORRAL_OUT_OF_MEMORY, "out of memory");
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

static bool model_busy(sched *s, const sched_model *sm) {
    for (job *j = s->jobs; j; j = j->next)
        if (j->model == sm) return true;
    for (sched_session *ss = s->sessions; ss; ss = ss->next)
        if (ss->model == sm && ss->busy) return true;
    return false;
}

static void answer_admin(sched *s, job *j) {
    const char *name = "";
    switch (j->req->body_case) {
        case CORRAL__V1__REQUEST__BODY_LOAD: name = j->req->load->model; break;
        case CORRAL__V1__REQUEST__BODY_UNLOAD: name = j->req->unload->model; break;
        case CORRAL__V1__REQUEST__BODY_PIN: name = j->req->pin->model; break;
        case CORRAL__V1__REQUEST__BODY_UNPIN: name = j->req->unpin->model; break;
        default: break;
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
            model_unload(s, sm);
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
        default: return;
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
    if (g->constraint[0]) {
        emit_error(s, j, CORRAL_UNSUPPORTED,
                   "this corrald does not support output constraints (Generate.constraint)");
        return;
    }
    if (g->sanitizer[0]) {
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
        case CORRAL__V1__REQUEST__BODY_GENERATE: admit_generate(s, j); break;
        case CORRAL__V1__REQUEST__BODY_STATUS: answer_status(s, j); break;
        case CORRAL__V1__REQUEST__BODY_LIST_MODELS: answer_list(s, j); break;
        case CORRAL__V1__REQUEST__BODY_TOKENIZE: answer_tokenize(s, j); break;
        case CORRAL__V1__REQUEST__BODY_LOAD:
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
        case CORRAL__V1__REQUEST__BODY_PIN:
        case CORRAL__V1__REQUEST__BODY_UNPIN: answer_admin(s, j); break;
        default:
            emit_error(s, j, CORRAL_INTERNAL, "the scheduler cannot handle this request");
            break;
    }
}

/* ---- choosing the next step ------------------------------------------------------------------- */

/* End jobs that were cancelled or ran out of time. */
static void reap(sched *s) {
    const int64_t now = mono_us();
    for (job *j = s->jobs, *next; j; j = next) {
        next = j->next;
        const int why = atomic_load(&j->cancel);
        if (why != JOB_CANCEL_NONE) {
            if (why == JOB_CANCEL_SHUTDOWN || !j->started) {
                finish_error(s, j, why == JOB_CANCEL_SHUTDOWN ? CORRAL_UNAVAILABLE : CORRAL_CANCELLED,
                             why == JOB_CANCEL_SHUTDOWN ? "corrald is shutting down"
                             : why == JOB_CANCEL_STALLED
                                 ? "the client stopped reading its stream"
                                 : "cancelled before it started");
            } else {
                gen_token t;
                gen_finish(j->gen, GEN_STOP_NONE, &t);
                if (t.len && !j->req->generate->stream) append_text(j, t.text, t.len);
                finish_done(s, j, CORRAL__V1__STOP_REASON__STOP_REASON_CANCELLED);
            }
        } else if (j->deadline_us && now > j->deadline_us) {
            finish_error(s, j, CORRAL_DEADLINE_EXCEEDED,
                         "deadline of %u ms passed while the request was %s",
                         j->req->generate->deadline_ms,
                         !j->started ? "queued"
                         : j->n_prefilled < j->n_prompt ? "reading the prompt"
                                                        : "generating");
        }
    }
}

/* Whether j can take a step now. */
static bool runnable(sched *s, job *j) {
    if (atomic_load(&j->paused)) return false;
    if (j->started) return true;
    sched_model *sm = j->model;
    if (sm->reload_pending && model_busy(s, sm)) return false;
    /* A session is used by one request at a time. */
    const char *sid = j->req->generate->session;
    if (sid[0])
        for (sched_session *ss = s->sessions; ss; ss = ss->next)
            if (strcmp(ss->id, sid) == 0 && ss->busy && ss->busy != j) return false;
    /* Realtime requests always start; others wait for an active slot. */
    return j->priority == CFG_PRIORITY_REALTIME || sm->n_active < (uint32_t)s->config->active_per_model;
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

/* ---- the thread ----------------------------------------------------------------------------------- */

static void *sched_main(void *arg) {
    sched *s = arg;
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
            if (keep) {
                keep->c = s->config;
                keep->next = s->old_configs;
                s->old_configs = keep;
                s->config = reload;
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
        for (sched_model *sm = s->models; sm; sm = sm->next)
            if ((sm->removed || sm->reload_pending) && sm->state == MODEL_RESIDENT &&
                !model_busy(s, sm))
                model_unload(s, sm);

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

/* ---- public ------------------------------------------------------------------------------------- */

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
    s->pool = threadpool_new((uint32_t)c->threads, err);
    if (!s->pool) {
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
    if (s->inbox_tail) s->inbox_tail->next = j;
    else s->inbox_head = j;
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
    while (s->sessions) session_free(s, s->sessions);
    for (sched_model *sm = s->models, *next; sm; sm = next) {
        next = sm->next;
        model_unload(s, sm);
        free(sm->name);
        free(sm);
    }
    threadpool_destroy(&s->pool);
    for (app_count *a = s->apps, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    for (cfg_keep *k = s->old_configs, *next; k; k = next) {
        next = k->next;
        cfg_destroy(&k->c);
        free(k);
    }
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
    free(j->prompt);
    free(j->generated);
    free(j->text);
    free(j);
}
