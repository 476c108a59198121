/*
 * job.c — jobs, their events and the sinks that collect them (see job.h for the contract).
 *
 * The exchange is a double buffer per job: the core appends to job->pending, the front end swaps
 * in an empty buffer of its own and sends what it got. Both buffers keep their capacity, so a
 * stream of tokens costs no allocation on either side once the first few have gone through.
 */
#include "job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/log.h"
#include "corral/utf8.h"
#include "mem.h"

/* Initial capacities: a token's text is rarely over a few dozen bytes, and a streamed job's
 * pending text holds one token or a few. */
#define JOB_TEXT_INITIAL_BYTES 4096
#define JOB_TEXT_INITIAL_IDS   1024

struct core_sink {
    pthread_mutex_t mu;
    job *head, *tail; /* ready queue */
    void (*notify)(void *ctx);
    void *ctx;
};

core_sink *core_sink_new(void (*notify)(void *ctx), void *ctx, corral_error *err) {
    core_sink *s = calloc(1, sizeof *s);
    if (!s) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->notify = notify;
    s->ctx = ctx;
    return s;
}

void core_sink_destroy(core_sink **ps) {
    if (!ps || !*ps) return;
    pthread_mutex_destroy(&(*ps)->mu);
    free(*ps);
    *ps = NULL;
}

size_t core_sink_take_ready(core_sink *s, job **out, size_t max) {
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    while (n < max && s->head) {
        job *j = s->head;
        s->head = j->ready_next;
        j->ready_next = NULL;
        j->queued = false;
        out[n++] = j;
    }
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return n;
}

corral_status job_text_init(job_text *t, corral_error *err) {
    *t = (job_text){0};
    /* Event buffers outlive any model: never in a model's arena. */
    const unsigned scope = mem_scope_default();
    t->text = malloc(JOB_TEXT_INITIAL_BYTES);
    t->ids = malloc(JOB_TEXT_INITIAL_IDS * sizeof *t->ids);
    mem_scope_leave(scope);
    if (!t->text || !t->ids) {
        job_text_free(t);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    t->cap = JOB_TEXT_INITIAL_BYTES;
    t->cap_ids = JOB_TEXT_INITIAL_IDS;
    t->text[0] = '\0';
    return CORRAL_OK;
}

void job_text_free(job_text *t) {
    free(t->text);
    free(t->ids);
    free(t->lps);
    free(t->lp_text);
    *t = (job_text){0};
}

const char *job_cancel_name(job_cancel why) {
    static const char *const names[JOB_CANCEL_COUNT] = {
        [JOB_CANCEL_NONE] = "none",         [JOB_CANCEL_CLIENT] = "client",
        [JOB_CANCEL_GONE] = "gone",         [JOB_CANCEL_STALLED] = "stalled",
        [JOB_CANCEL_SHUTDOWN] = "shutdown", [JOB_CANCEL_SILENT] = "silent",
    };
    return (unsigned)why < JOB_CANCEL_COUNT && names[why] ? names[why] : "unknown";
}

job *job_new(core_sink *sink, corral_error *err) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    if (job_text_init(&j->pending, err) != CORRAL_OK) {
        free(j);
        return NULL;
    }
    j->sink = sink;
    atomic_init(&j->cancel, JOB_CANCEL_NONE);
    atomic_init(&j->paused, 0);
    return j;
}

/* Take j out of its sink's ready queue, if it is there: the front end may free a job while a
 * later event of it (the final one, taken in the same pass) still queues it. */
static void sink_forget(job *j) {
    core_sink *s = j->sink;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (j->queued) {
        job *prev = NULL;
        for (job *q = s->head; q; prev = q, q = q->ready_next)
            if (q == j) {
                if (prev)
                    prev->ready_next = q->ready_next;
                else
                    s->head = q->ready_next;
                if (s->tail == q) s->tail = prev;
                break;
            }
        j->queued = false;
    }
    pthread_mutex_unlock(&s->mu);
}

void job_free(job **pj) {
    if (!pj || !*pj) return;
    job *j = *pj;
    sink_forget(j);
    job_text_free(&j->pending);
    free(j->done.sanitizer_report);
    core_reply_destroy(&j->reply);
    if (j->front_free) j->front_free(j->front);
    free(j);
    *pj = NULL;
}

void job_take(job *j, bool with_text, job_text *spare, job_taken *out) {
    core_sink *s = j->sink;
    pthread_mutex_lock(&s->mu);
    if (with_text && (j->pending.len || j->pending.n_ids)) {
        const job_text t = j->pending;
        j->pending = *spare;
        *spare = t;
    }
    out->n_progress = j->n_progress;
    memcpy(out->progress, j->progress, j->n_progress * sizeof *j->progress);
    j->n_progress = 0;
    out->final = j->final;
    pthread_mutex_unlock(&s->mu);
}

/* Put j in its sink's ready queue (caller holds the lock); true when the front end must be told. */
static bool enqueue_locked(job *j) {
    if (j->queued) return false;
    core_sink *s = j->sink;
    j->queued = true;
    j->ready_next = NULL;
    if (s->tail)
        s->tail->ready_next = j;
    else
        s->head = j;
    s->tail = j;
    return true;
}

/* Grow a buffer to hold `need` elements, doubling; in the default arena (see job_text_init). */
static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    const unsigned scope = mem_scope_default();
    void *q = realloc(*p, n * elem);
    mem_scope_leave(scope);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

void job_emit_text(job *j, const char *text, size_t len, int32_t id) {
    job_emit_token(j, text, len, id, NULL, NULL, 0);
}

void job_emit_token(job *j, const char *text, size_t len, int32_t id, const job_logprob *lps,
                    const char *const *texts, size_t n) {
    core_sink *s = j->sink;
    pthread_mutex_lock(&s->mu);
    job_text *t = &j->pending;
    if (n && grow((void **)&t->lps, &t->cap_lps, t->n_lps + n, sizeof *t->lps)) {
        for (size_t i = 0; i < n; i++) {
            job_logprob e = lps[i];
            e.text_off = (uint32_t)t->lp_text_len;
            if (!grow((void **)&t->lp_text, &t->lp_text_cap, t->lp_text_len + e.text_len + 1, 1))
                e.text_len = 0;
            if (e.text_len) memcpy(t->lp_text + t->lp_text_len, texts[i], e.text_len);
            t->lp_text_len += e.text_len;
            t->lps[t->n_lps++] = e;
        }
    }
    if (len && grow((void **)&t->text, &t->cap, t->len + len + 1, 1)) {
        memcpy(t->text + t->len, text, len);
        t->len += len;
        t->text[t->len] = '\0';
    }
    if (id >= 0 && grow((void **)&t->ids, &t->cap_ids, t->n_ids + 1, sizeof *t->ids))
        t->ids[t->n_ids++] = id;
    const bool tell = enqueue_locked(j);
    pthread_mutex_unlock(&s->mu);
    if (tell) s->notify(s->ctx);
}

void job_emit_progress(job *j, job_phase phase, uint64_t done, uint64_t total) {
    core_sink *s = j->sink;
    pthread_mutex_lock(&s->mu);
    const job_progress p = {.phase = phase, .done = done, .total = total};
    if (j->n_progress && j->progress[j->n_progress - 1].phase == phase)
        j->progress[j->n_progress - 1] = p; /* the same phase, further on */
    else if (j->n_progress < JOB_PROGRESS_MAX)
        j->progress[j->n_progress++] = p;
    else
        j->progress[JOB_PROGRESS_MAX - 1] = p; /* (more phases than a request goes through) */
    const bool tell = enqueue_locked(j);
    pthread_mutex_unlock(&s->mu);
    if (tell) s->notify(s->ctx);
}

/* Mark the final event (its data already written) and queue the job. */
static void emit_final(job *j, job_final kind) {
    core_sink *s = j->sink;
    pthread_mutex_lock(&s->mu);
    j->final = kind;
    const bool tell = enqueue_locked(j);
    pthread_mutex_unlock(&s->mu);
    /* From here on the front end may free j: only the sink is used. */
    if (tell) s->notify(s->ctx);
}

void job_emit_done(job *j, const core_done *done) {
    j->done = *done;
    emit_final(j, JOB_FINAL_DONE);
}

/* The name of a request's kind, for logs. */
static const char *kind_name(core_kind kind) {
    static const char *const names[] = {
        [CORE_GENERATE] = "generate", [CORE_TOKENIZE] = "tokenize", [CORE_LIST_MODELS] = "models",
        [CORE_STATUS] = "status",     [CORE_LOAD] = "load",         [CORE_UNLOAD] = "unload",
        [CORE_PIN] = "pin",           [CORE_UNPIN] = "unpin",
    };
    return (size_t)kind < sizeof names / sizeof names[0] && names[kind] ? names[kind] : "unknown";
}

/* The model a request names ("" for none). */
static const char *request_model(const core_request *r) {
    const char *m = r->kind == CORE_GENERATE      ? r->generate.model
                    : r->kind == CORE_TOKENIZE    ? r->tokenize.model
                    : r->kind != CORE_LIST_MODELS ? r->target.model
                                                  : NULL;
    return m ? m : "";
}

/* Every failed request is logged with its reason, so that an operator sees in corrald's log what
 * its clients were told. A cancellation is not a failure (the core logs it where it notices it,
 * with why), a shutdown neither (info); a refusal by an app rule is logged by apps_deny, with
 * the rule. */
static void log_failure(const job *j, corral_status code) {
    if (code == CORRAL_PERMISSION_DENIED || code == CORRAL_CANCELLED) return;
    const bool expected = code == CORRAL_UNAVAILABLE;
    log_write(expected ? LOG_LEVEL_INFO : LOG_LEVEL_WARN, "request failed", LOG_UINT("id", j->id),
              LOG_STR("app", j->app[0] ? j->app : "(default)"),
              LOG_STR("kind", kind_name(j->req.kind)), LOG_STR("model", request_model(&j->req)),
              LOG_STR("code", corral_status_name(code)), LOG_STR("reason", j->error_message),
              LOG_END_);
}

void job_emit_error(job *j, corral_status code, const char *fmt, ...) {
    /* Messages echo client bytes (names, text): whatever they hold, what leaves is UTF-8. */
    char raw[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    const size_t len = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    utf8_escape(j->error_message, sizeof j->error_message, (const uint8_t *)raw, len);
    j->error_code = code;
    log_failure(j, code);
    emit_final(j, JOB_FINAL_ERROR);
}

void job_emit_reply(job *j, core_reply *reply) {
    j->reply = reply;
    emit_final(j, JOB_FINAL_REPLY);
}

/* ---- replies --------------------------------------------------------------------------------- */

core_reply *core_reply_new(core_kind kind) {
    const unsigned scope = mem_scope_default();
    core_reply *r = calloc(1, sizeof *r);
    mem_scope_leave(scope);
    if (r) r->kind = kind;
    return r;
}

void core_reply_destroy(core_reply **pr) {
    if (!pr || !*pr) return;
    core_reply *r = *pr;
    free(r->ids);
    for (size_t i = 0; r->pieces && i < r->n_ids; i++) free(r->pieces[i]);
    free(r->pieces);
    for (size_t i = 0; i < r->n_models; i++) {
        core_model_info *m = &r->models[i];
        free(m->name);
        free(m->path);
        free(m->arch);
        free(m->chat_template);
        free(m->error);
        for (size_t k = 0; k < m->n_adapters; k++) free(m->adapters[k].path);
        free(m->adapters);
    }
    free(r->models);
    free(r);
    *pr = NULL;
}
