/*
 * session.c — conversations kept between requests.
 *
 * A session is named by its id and belongs to the app that made it: a request that names it
 * continues it, and a request of another app naming the same id is refused (PERMISSION_DENIED,
 * checked at admission and again when the request starts) until the session ends. Its KV cache
 * stays in memory between requests (charged to its model), so the next turn only prefills what is
 * new: the longest prefix of the new prompt that the cache already holds is reused. When memory is
 * needed an idle session's cache is written to the swap directory (swap.h) and read back when the
 * conversation continues; a bad or stale image only costs recomputation. Sessions are private to
 * their app, used by one request at a time, dropped after limits.session_ttl_ms idle or when more
 * than limits.max_sessions exist (least recently used first), and written out at shutdown so that
 * they survive a restart.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/fault.h"
#include "corral/log.h"
#include "sched_impl.h"

swap_session_key session_key(const sched_session *ss) {
    return (swap_session_key){.app = ss->app,
                              .session = ss->id,
                              .model_name = ss->model->name,
                              .model_fingerprint =
                                  ss->model->m ? model_file_fingerprint(ss->model->m) : "",
                              .context = ss->model->context,
                              .kv_f32 = ss->model->cfg->kv_f32};
}

/* ---- writing and reading caches (on the io actor) ---------------------------------------- */

/* One session image written or read. The compute thread leaves the session's cache and tokens
 * alone while `io` is set. */
typedef struct session_io_task {
    core_task t;
    sched_session *ss;
    sjob *sj; /* a read: the job waiting for it */
    swap_dir *swap;
    /* The key's strings, copied: the model's entry may change while the task runs. */
    char app[64], session[128], model_name[128];
    char model_fingerprint[IMAGE_FINGERPRINT_CHARS + 1];
    uint32_t context;
    int kv_f32;
    kv_cache *kv;
    int32_t *tokens; /* a write: the session's (borrowed); a read: the image's (the result) */
    uint32_t n;
    corral_status status;
    corral_error err;
} session_io_task;

static swap_session_key task_key(const session_io_task *t) {
    return (swap_session_key){.app = t->app,
                              .session = t->session,
                              .model_name = t->model_name,
                              .model_fingerprint = t->model_fingerprint,
                              .context = t->context,
                              .kv_f32 = t->kv_f32};
}

static session_io_task *io_task_new(struct core *k, sched_session *ss) {
    session_io_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ss = ss;
    t->swap = k->swap;
    const swap_session_key key = session_key(ss);
    snprintf(t->app, sizeof t->app, "%s", key.app);
    snprintf(t->session, sizeof t->session, "%s", key.session);
    snprintf(t->model_name, sizeof t->model_name, "%s", key.model_name);
    snprintf(t->model_fingerprint, sizeof t->model_fingerprint, "%s", key.model_fingerprint);
    t->context = key.context;
    t->kv_f32 = key.kv_f32;
    t->kv = ss->kv;
    return t;
}

/* A session image is written, or read back through its mapping, under a fault guard (fault.h):
 * an image truncated while it is mapped is a bad image (the conversation is recomputed), not a
 * dead daemon. A cut-short write leaves at most its temporary, which the next start removes; a
 * cut-short read's image is deleted here. */
static void io_run(session_io_task *t, bool write) {
    const swap_session_key key = task_key(t);
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        if (write)
            t->status = swap_session_write(t->swap, &key, t->kv, t->tokens, t->n, &t->err);
        else
            t->status = swap_session_read(t->swap, &key, t->kv, &t->tokens, &t->n, &t->err);
        fault_guard_leave(&g);
    } else {
        if (!write) swap_session_discard(t->swap, &key);
        t->tokens = write ? t->tokens : NULL;
        t->n = write ? t->n : 0;
        t->status = corral_error_set(
            &t->err, CORRAL_IO, "session '%s': its image failed while it was %s (SIGBUS: %s)",
            t->session, write ? "written" : "read", fault_code_text(g.info.code));
    }
}

static void write_run(actor_task *base) {
    io_run((session_io_task *)base, true);
}

/* The write is done (or failed): the cache's memory goes either way. */
static void write_finish(struct core *k, core_task *ct) {
    (void)k;
    session_io_task *t = (session_io_task *)ct;
    sched_session *ss = t->ss;
    ss->io = false;
    if (!t->t.base.ran) corral_error_set(&t->err, CORRAL_CANCELLED, "shutting down");
    ss->swapped = t->t.base.ran && t->status == CORRAL_OK;
    if (!ss->swapped) {
        log_warn("session state dropped: it could not be swapped out", LOG_STR("session", ss->id),
                 LOG_STR("error", t->err.message));
        /* The client resends the conversation's text each turn: only recomputation is lost. */
        ss->n_tokens = 0;
    }
    log_debug("session swapped out", LOG_STR("session", ss->id), LOG_UINT("positions", t->n),
              LOG_INT("on_disk", ss->swapped));
    residency_kv_free(ss->model, &ss->kv);
    free(t);
}

void session_start_swap_out(struct core *k, sched_session *ss) {
    if (!ss->kv || ss->io || ss->busy) return;
    const uint32_t n = kv_cache_n_pos(ss->kv);
    if (n == 0 || !swap_dir_writable(k->swap)) {
        if (n > 0)
            log_warn("session state dropped: the swap directory is not writable",
                     LOG_STR("session", ss->id), LOG_STR("dir", swap_dir_path(k->swap)));
        ss->swapped = false;
        ss->n_tokens = 0;
        residency_kv_free(ss->model, &ss->kv);
        return;
    }
    session_io_task *t = io_task_new(k, ss);
    if (!t) {
        session_swap_out_now(k, ss);
        return;
    }
    actor_task_init(&t->t.base, write_run, 0);
    t->t.finish = write_finish;
    t->tokens = ss->tokens;
    t->n = n;
    ss->io = true;
    sched_post(k, k->io, &t->t);
}

void session_swap_out_now(struct core *k, sched_session *ss) {
    if (!ss->kv) return;
    const uint32_t n = kv_cache_n_pos(ss->kv);
    ss->swapped = false;
    if (n > 0) {
        const swap_session_key key = session_key(ss);
        corral_error err;
        if (!swap_dir_writable(k->swap))
            log_warn("session state dropped: the swap directory is not writable",
                     LOG_STR("session", ss->id), LOG_STR("dir", swap_dir_path(k->swap)));
        else if (swap_session_write(k->swap, &key, ss->kv, ss->tokens, n, &err) != CORRAL_OK)
            log_warn("session state dropped: it could not be swapped out",
                     LOG_STR("session", ss->id), LOG_STR("error", err.message));
        else
            ss->swapped = true;
    }
    if (!ss->swapped) ss->n_tokens = 0;
    residency_kv_free(ss->model, &ss->kv);
}

static void read_run(actor_task *base) {
    /* The tokens outlive the model's arena (session bookkeeping): the default arena. */
    const unsigned scope = mem_scope_default();
    io_run((session_io_task *)base, false);
    mem_scope_leave(scope);
}

/* The image is in (or was bad: the conversation is recomputed from its text, the request still
 * succeeds); the waiting job goes on. */
static void read_finish(struct core *k, core_task *ct) {
    session_io_task *t = (session_io_task *)ct;
    sched_session *ss = t->ss;
    ss->io = false;
    ss->swapped = false;
    if (!t->t.base.ran) corral_error_set(&t->err, CORRAL_CANCELLED, "shutting down");
    if (!t->t.base.ran || t->status != CORRAL_OK) {
        log_warn("session image discarded; the conversation is recomputed",
                 LOG_STR("session", ss->id), LOG_STR("error", t->err.message));
        ss->n_tokens = 0;
        free(t->tokens);
    } else {
        free(ss->tokens);
        ss->tokens = t->tokens;
        ss->cap_tokens = ss->n_tokens = t->n;
        log_debug("session swapped in", LOG_STR("session", ss->id), LOG_UINT("positions", t->n));
    }
    sjob *sj = t->sj;
    free(t);
    sj->task = NULL;
    batch_finish_start(k, sj);
}

void session_start_swap_in(struct core *k, sched_session *ss, sjob *sj) {
    session_io_task *t = io_task_new(k, ss);
    if (!t) {
        /* Recompute instead. */
        ss->swapped = false;
        ss->n_tokens = 0;
        batch_finish_start(k, sj);
        return;
    }
    actor_task_init(&t->t.base, read_run, sj->priority);
    t->t.finish = read_finish;
    t->sj = sj;
    ss->io = true;
    sj->phase = SJOB_SESSION_IN;
    sj->task = &t->t;
    sched_post(k, k->io, &t->t);
}

bool session_any_in_memory(const struct core *k, const sched_model *sm) {
    for (const sched_session *ss = k->sessions; ss; ss = ss->next)
        if (ss->model == sm && (ss->kv || ss->io)) return true;
    return false;
}

void session_free(struct core *k, sched_session *ss) {
    for (sched_session **pp = &k->sessions; *pp; pp = &(*pp)->next)
        if (*pp == ss) {
            *pp = ss->next;
            break;
        }
    if (ss->model) {
        ss->model->n_sessions--;
        residency_kv_free(ss->model, &ss->kv);
        if (ss->swapped) {
            const swap_session_key key = session_key(ss);
            swap_session_discard(k->swap, &key);
        }
    }
    free(ss->tokens);
    free(ss);
}

size_t session_count(const struct core *k) {
    size_t n = 0;
    for (const sched_session *ss = k->sessions; ss; ss = ss->next) n++;
    return n;
}

void session_expire(struct core *k) {
    const int64_t now = sched__mono_us();
    const cfg *c = core_cfg(k);
    for (sched_session *ss = k->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (!ss->busy && !ss->io && now - ss->last_used_us > c->session_ttl_ms * 1000LL) {
            log_debug("session expired", LOG_STR("session", ss->id), LOG_STR("app", ss->app));
            session_free(k, ss);
        }
    }
    while (session_count(k) > (size_t)c->max_sessions) {
        sched_session *oldest = NULL;
        for (sched_session *ss = k->sessions; ss; ss = ss->next)
            if (!ss->busy && !ss->io && (!oldest || ss->last_used_us < oldest->last_used_us))
                oldest = ss;
        if (!oldest) break;
        session_free(k, oldest);
    }
}

bool session_of_another_app(struct core *k, const char *id, const char *app) {
    bool other = false;
    for (const sched_session *ss = k->sessions; ss; ss = ss->next) {
        if (strcmp(ss->id, id) != 0) continue;
        if (strcmp(ss->app, app) == 0) return false;
        other = true;
    }
    const swap_session_key own = {.app = app, .session = id};
    if (swap_session_exists(k->swap, &own)) return false;
    return other || swap_session_held_elsewhere(k->swap, id, app);
}

corral_status session_attach(struct core *k, sjob *sj, corral_error *err) {
    const char *id = sj->j->req.generate.session;
    if (session_of_another_app(k, id, sj->j->app)) {
        apps_log_denial(sj->j, "sessions", sj->model->name);
        return corral_error_set(err, CORRAL_PERMISSION_DENIED, SESSION_DENIED_FMT, id);
    }
    for (sched_session *ss = k->sessions; ss; ss = ss->next) {
        if (strcmp(ss->id, id) != 0 || strcmp(ss->app, sj->j->app) != 0) continue;
        if (ss->model != sj->model) {
            if (ss->busy)
                return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                        "session '%s' is in use with model '%s'", id,
                                        ss->model->name);
            /* Moving a session to another model starts it afresh. */
            if (ss->swapped) {
                const swap_session_key key = session_key(ss);
                swap_session_discard(k->swap, &key);
                ss->swapped = false;
            }
            residency_kv_free(ss->model, &ss->kv);
            ss->model->n_sessions--;
            ss->n_tokens = 0;
            ss->model = sj->model;
            sj->model->n_sessions++;
        }
        sj->session = ss;
        return CORRAL_OK;
    }
    if (strlen(id) >= sizeof(((sched_session *)0)->id))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "session id longer than 127 bytes");
    /* Session bookkeeping outlives models: the default arena. */
    const unsigned scope = mem_scope_default();
    sched_session *ss = calloc(1, sizeof *ss);
    mem_scope_leave(scope);
    if (!ss) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    snprintf(ss->id, sizeof ss->id, "%s", id);
    snprintf(ss->app, sizeof ss->app, "%s", sj->j->app);
    ss->model = sj->model;
    ss->last_used_us = sched__mono_us();
    ss->last_used_ms = sched__unix_ms();
    const swap_session_key key = session_key(ss);
    ss->swapped = swap_session_exists(k->swap, &key);
    sj->model->n_sessions++;
    ss->next = k->sessions;
    k->sessions = ss;
    sj->session = ss;
    return CORRAL_OK;
}

void session_detach(struct core *k, sjob *sj) {
    (void)k;
    sched_session *ss = sj->session;
    if (!ss) return;
    if (ss->busy != sj) {
        sj->session = NULL;
        return;
    }
    /* The session keeps what is in its cache: prompt ids, then generated ids, as far as the
     * cache holds them (the last sampled token was never run). */
    uint32_t n = ss->kv ? kv_cache_n_pos(ss->kv) : 0;
    const uint32_t total = sj->n_prompt + sj->n_generated;
    if (n > total) n = total;
    if (n > ss->cap_tokens) {
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
        ss->tokens[i] = i < sj->n_prompt ? sj->prompt[i] : sj->generated[i - sj->n_prompt];
    /* (A sliding-window cache may have to empty itself instead: kv_cache_truncate.) */
    ss->n_tokens = ss->kv ? kv_cache_truncate(ss->kv, n) : n;
    ss->busy = NULL;
    ss->last_used_us = sched__mono_us();
    ss->last_used_ms = sched__unix_ms();
    sj->session = NULL;
    sj->kv = NULL;
}

void session_save_all(struct core *k) {
    while (k->sessions) {
        sched_session *ss = k->sessions;
        k->sessions = ss->next;
        if (ss->model) {
            session_swap_out_now(k, ss);
            ss->model->n_sessions--;
        }
        free(ss->tokens);
        free(ss);
    }
}
