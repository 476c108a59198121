/*
 * status.c — the answers that describe the daemon (Status, ListModels) as plain structs
 * (request.h's core_reply): a snapshot taken on the compute thread between steps, with copies of
 * every string, so that a front end can translate it whenever it likes. An app sees the models it
 * may use (apps[].models), and the daemon's totals.
 */
#include <stdlib.h>
#include <string.h>

#include "sched_impl.h"

static char *dup_or_empty(const char *s) {
    return strdup(s ? s : "");
}

/* Fill m with what both answers share; false when out of memory. */
static bool fill_common(const sched_model *sm, core_model_info *m) {
    const bool resident = sm->state == CORE_MODEL_RESIDENT;
    m->name = strdup(sm->name);
    m->path = strdup(sm->cfg->path);
    m->arch = dup_or_empty(sm->m ? model_get_hparams(sm->m)->arch : NULL);
    m->context = resident ? sm->context : (uint32_t)sm->cfg->context;
    m->chat_template =
        dup_or_empty(resident ? chat_template_name(sm->tmpl) : sm->cfg->chat_template);
    m->state = sm->state;
    m->context_overflow = cfg_overflow_name(sm->cfg->context_overflow);
    m->error = strdup(sm->state == CORE_MODEL_BROKEN ? sm->broken_reason : "");
    m->pinned = sm->pinned;
    m->preload = sm->cfg->preload;
    if (sm->cfg->n_adapters) {
        m->adapters = calloc(sm->cfg->n_adapters, sizeof *m->adapters);
        if (!m->adapters) return false;
        m->n_adapters = sm->cfg->n_adapters;
        for (size_t i = 0; i < m->n_adapters; i++) {
            m->adapters[i].scale = sm->cfg->adapters[i].scale;
            if (!(m->adapters[i].path = strdup(sm->cfg->adapters[i].path))) return false;
        }
    }
    return m->name && m->path && m->arch && m->chat_template && m->error;
}

static void fill_status(const struct core *k, const sched_model *sm, core_model_info *m) {
    m->bytes = residency_model_bytes(sm);
    m->ttl_ms = (uint64_t)sm->cfg->ttl_ms;
    m->last_used_ms = (uint64_t)sm->last_used_ms;
    uint32_t active = 0;
    for (const sjob *sj = k->jobs; sj; sj = sj->next)
        active += sj->model == sm && sj->phase == SJOB_ACTIVE;
    m->active = active;
    m->queue_depth = sm->n_queued - active;
    m->requests_served = sm->served;
    m->sessions = sm->n_sessions;
    m->swap_ins = sm->swap_ins;
    m->swap_outs = sm->swap_outs;
    m->merges = sm->merges;
    m->last_load_ms = (uint64_t)(sm->load_us / 1000);
    m->loads = sm->loads;
    m->steps = sm->steps;
    m->step_sequences = sm->step_sequences;
}

/* Whether sm goes in j's answer: configured, the one asked for (if any), one its app may use. */
static bool listed(const struct core *k, const job *j, const sched_model *sm, const char *want) {
    return !sm->removed && (!want[0] || strcmp(want, sm->name) == 0) &&
           apps_allows_model_name(k, j, sm->name);
}

/* A reply listing the configured models j's app may use (only `want` when it is not empty). */
static core_reply *snapshot(struct core *k, const job *j, core_kind kind, const char *want) {
    size_t n = 0;
    for (sched_model *sm = k->models; sm; sm = sm->next) n += listed(k, j, sm, want);
    core_reply *r = core_reply_new(kind);
    if (!r) return NULL;
    const unsigned scope = mem_scope_default();
    r->models = calloc(n ? n : 1, sizeof *r->models);
    bool ok = r->models != NULL;
    for (sched_model *sm = k->models; ok && sm; sm = sm->next) {
        if (!listed(k, j, sm, want)) continue;
        core_model_info *m = &r->models[r->n_models++];
        ok = fill_common(sm, m);
        if (kind == CORE_STATUS) fill_status(k, sm, m);
    }
    mem_scope_leave(scope);
    if (!ok) core_reply_destroy(&r);
    return r;
}

void status_model_not_found(struct core *k, job *j, const char *name) {
    char names[512];
    size_t len = 0, n = 0, more = 0, hidden = 0;
    names[0] = '\0';
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        if (!listed(k, j, sm, "")) {
            hidden += !sm->removed;
            continue;
        }
        const size_t need = strlen(sm->name) + (n ? 2 : 0);
        if (more || len + need + 1 > sizeof names - 16) {
            more++;
            continue;
        }
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", n ? ", " : "", sm->name);
        n++;
    }
    if (more) snprintf(names + len, sizeof names - len, " and %zu more", more);
    job_emit_error(j, CORRAL_NOT_FOUND, "model '%s' is not configured; %s%s", name,
                   n        ? "configured: "
                   : hidden ? "this app may use none of the configured models"
                            : "no models are configured",
                   names);
}

void status_answer(struct core *k, job *j) {
    const char *want = j->req.target.model;
    if (want[0] && (!residency_find(k, want) || residency_find(k, want)->removed)) {
        status_model_not_found(k, j, want);
        return;
    }
    if (want[0] && !apps_allow_model(k, j, residency_find(k, want))) return;
    core_reply *r = snapshot(k, j, CORE_STATUS, want);
    if (!r) {
        job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    core_daemon_info *d = &r->daemon;
    for (sched_model *sm = k->models; sm; sm = sm->next) {
        if (sm->removed) continue;
        d->total_bytes += residency_model_bytes(sm);
        d->queued += sm->n_queued;
    }
    for (const sjob *sj = k->jobs; sj; sj = sj->next) d->active += sj->phase == SJOB_ACTIVE;
    d->queued -= d->active < d->queued ? d->active : d->queued;
    d->uptime_ms = (uint64_t)(sched__unix_ms() - k->started_ms);
    d->limit_bytes = core_cfg(k)->memory_limit;
    d->requests_served = k->served;
    d->sessions = (uint32_t)session_count(k);
    d->threads = threadpool_n_threads(k->pool);
    d->allocated_bytes = mem_allocated_bytes(MEM_THREAD_CORE);
    d->front_allocated_bytes = mem_allocated_bytes(MEM_THREAD_FRONT);
    d->heap_bytes = mem_heap_live_bytes();
    job_emit_reply(j, r);
}

void status_answer_list(struct core *k, job *j) {
    core_reply *r = snapshot(k, j, CORE_LIST_MODELS, "");
    if (!r)
        job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
    else
        job_emit_reply(j, r);
}
