/*
 * apps.c — the per-app rules of the core: what each app may do, its counters, and its fair
 * share of a model's queue and active slots.
 *
 * A front end establishes the app of a request (job->app, job->owner: auth.h); everything below
 * is enforced here, in the core, so that every front end gets the same rules by setting those two
 * fields. The rules come from the app's entry in the current configuration (apps[]): the models
 * it may use, its priority ceiling, whether it may use admin operations (Load, Unload, Pin,
 * Unpin; a reload is by signal only, so no client can ask for one), its Generate requests in
 * flight (max_concurrent), its requests per minute and the tokens one request may ask for.
 * corrald's owner acting as itself has no limits of its own; the default app "" (a front end's
 * unauthenticated clients) has the rules of the entry auth.default_app names, and without one,
 * like apps no entry names, may use every model up to interactive and no admin operation. A
 * session belongs to the app that made it: another app naming its id is refused. Every refusal is
 * an Error PERMISSION_DENIED whose message names the rule, and a log line with the app, the rule
 * and the model.
 *
 * Counters. An app's counter holds its requests in flight and its rate bucket; it exists while
 * either says something (requests in flight, or a bucket not yet full again) and is dropped
 * afterwards, so app names that come and go leave nothing behind.
 *
 * Fair shares. limits.queue_per_app bounds one app's requests, but a model's queue
 * (limits.queue_per_model) could still be filled by one app that sends as many as it may; and
 * its active slots (limits.active_per_model) go to the requests that came first. So, per model:
 *   - queue: when the queue is full and a request of an app holding less than its share comes
 *     (the queue divided evenly among the apps in it, the newcomer's counted), the newest waiting
 *     request of the app holding the most beyond its share is refused (RESOURCE_EXHAUSTED) to make
 *     room, instead of the newcomer;
 *   - slots: an app already running its share of the slots (active_per_model divided among the
 *     apps with requests running or ready to run) lets another app's ready request of at least
 *     the same class start first. When no other app waits, it takes any free slot: the rule never
 *     leaves a slot idle.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/log.h"
#include "sched_impl.h"

/* ---- rules --------------------------------------------------------------------------------- */

app_rules apps_rules(const struct core *k, const job *j) {
    const bool owner = j->owner && strcmp(j->app, AUTH_OWNER_APP) == 0;
    /* The default app "" follows auth.default_app's entry when the config names one. */
    const cfg *c = core_cfg(k);
    const cfg_app *a = owner ? NULL : cfg_find_app(c, j->app[0] ? j->app : c->default_app);
    return (app_rules){
        .app = a,
        .owner = owner,
        .name = j->app[0] ? j->app : "(default)",
        .ceiling = owner ? CFG_PRIORITY_REALTIME
                   : a   ? a->max_priority
                         : CFG_PRIORITY_INTERACTIVE,
        .admin = owner || (a && a->admin),
        .max_concurrent = a ? (uint32_t)a->max_concurrent : 0,
        .per_minute = a ? (uint32_t)a->requests_per_minute : 0,
        .max_tokens = a ? (uint32_t)a->max_tokens : 0,
    };
}

void apps_log_denial(const job *j, const char *rule, const char *model) {
    log_warn("permission denied", LOG_STR("app", j->app[0] ? j->app : "(default)"),
             LOG_STR("rule", rule), LOG_STR("model", model ? model : ""), LOG_UINT("id", j->id));
}

void apps_deny(job *j, const char *rule, const char *model, const char *fmt, ...) {
    char message[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    apps_log_denial(j, rule, model);
    j->error_rule = rule;
    job_emit_error(j, CORRAL_PERMISSION_DENIED, "%s", message);
}

/* ---- counters ------------------------------------------------------------------------------ */

static app_count *counter_find(struct core *k, const char *app) {
    for (app_count *a = k->apps; a; a = a->next)
        if (strcmp(a->app, app) == 0) return a;
    return NULL;
}

/* The counter of app, made when missing (NULL when out of memory). A new counter's bucket is
 * full: only a counter whose bucket is full is ever dropped. */
static app_count *counter_get(struct core *k, const char *app, uint32_t per_minute) {
    app_count *a = counter_find(k, app);
    if (a) return a;
    if (!(a = calloc(1, sizeof *a))) return NULL;
    snprintf(a->app, sizeof a->app, "%s", app);
    a->tokens = per_minute;
    a->refill_us = sched__mono_us();
    a->next = k->apps;
    k->apps = a;
    atomic_fetch_add(&k->n_apps, 1);
    return a;
}

/* Top the bucket up for the time since it was last: per_minute a minute, at most per_minute. */
static void bucket_refill(app_count *a, uint32_t per_minute, int64_t now) {
    if (per_minute == 0) return;
    a->tokens += (double)(now - a->refill_us) * per_minute / 60e6;
    if (a->tokens > per_minute) a->tokens = per_minute;
    a->refill_us = now;
}

static bool counter_idle(const app_count *a, uint32_t per_minute) {
    return a->n == 0 && (per_minute == 0 || a->tokens >= per_minute);
}

static void counter_drop_if_idle(struct core *k, app_count *a, uint32_t per_minute) {
    if (!counter_idle(a, per_minute)) return;
    for (app_count **pp = &k->apps; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            free(a);
            atomic_fetch_sub(&k->n_apps, 1);
            return;
        }
}

/* The rate rule: take one request from the bucket, or refuse. */
static bool take_rate(struct core *k, job *j, const app_rules *r) {
    if (r->per_minute == 0) return true;
    app_count *a = counter_get(k, j->app, r->per_minute);
    if (!a) {
        job_emit_error(j, CORRAL_OUT_OF_MEMORY, "out of memory");
        return false;
    }
    bucket_refill(a, r->per_minute, sched__mono_us());
    if (a->tokens < 1.0) {
        apps_deny(j, "requests_per_minute", NULL,
                  "app '%s' is over its rate of %u requests per minute "
                  "(apps[].requests_per_minute)",
                  r->name, r->per_minute);
        return false;
    }
    a->tokens -= 1.0;
    return true;
}

void apps_count(struct core *k, sjob *sj) {
    const app_rules r = apps_rules(k, sj->j);
    app_count *a = counter_get(k, sj->j->app, r.per_minute);
    if (a) a->n++;
    sj->counter = a; /* valid while it counts: a counter goes only when its n is 0 */
}

void apps_uncount(struct core *k, sjob *sj) {
    app_count *a = sj->counter;
    sj->counter = NULL;
    if (!a) return;
    if (a->n) a->n--;
    const app_rules r = apps_rules(k, sj->j);
    bucket_refill(a, r.per_minute, sched__mono_us());
    counter_drop_if_idle(k, a, r.per_minute);
}

void apps_tick(struct core *k) {
    const int64_t now = sched__mono_us();
    for (app_count *a = k->apps, *next; a; a = next) {
        next = a->next;
        const cfg_app *ca = cfg_find_app(core_cfg(k), a->app);
        const uint32_t per_minute = ca ? (uint32_t)ca->requests_per_minute : 0;
        bucket_refill(a, per_minute, now);
        counter_drop_if_idle(k, a, per_minute);
    }
}

void apps_free_all(struct core *k) {
    for (app_count *a = k->apps, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    k->apps = NULL;
    atomic_store(&k->n_apps, 0);
}

/* ---- admission ----------------------------------------------------------------------------- */

/* The admin operation a request is, for messages; NULL for the others. */
static const char *admin_verb(core_kind kind) {
    static const char *const verbs[] = {
        [CORE_LOAD] = "load", [CORE_UNLOAD] = "unload", [CORE_PIN] = "pin", [CORE_UNPIN] = "unpin"};
    return kind >= CORE_LOAD && kind <= CORE_UNPIN ? verbs[kind] : NULL;
}

bool apps_admit(struct core *k, job *j) {
    if (j->req.kind == CORE_STATUS || j->req.kind == CORE_LIST_MODELS) return true;
    const app_rules r = apps_rules(k, j);
    if (!take_rate(k, j, &r)) return false;
    const char *verb = admin_verb(j->req.kind);
    if (verb && !r.admin) {
        apps_deny(j, "admin", j->req.target.model,
                  "app '%s' may not %s models: admin operations need apps[].admin", r.name, verb);
        return false;
    }
    return true;
}

bool apps_allow_model(struct core *k, job *j, const sched_model *sm) {
    const app_rules r = apps_rules(k, j);
    if (cfg_app_allows_model(r.app, sm->name)) return true;
    apps_deny(j, "models", sm->name, "app '%s' may not use model '%s' (apps[].models)", r.name,
              sm->name);
    return false;
}

bool apps_allows_model_name(const struct core *k, const job *j, const char *model) {
    return cfg_app_allows_model(apps_rules(k, j).app, model);
}

/* Tally the counted Generate requests on sm that pass `in` (NULL: all) per app, in one walk: each
 * app's counter gets the count of this walk (stamped, so that a counter not met has none).
 * Returns how many apps have one. Linear in the jobs: it runs on every admission to a full queue
 * and for every slot that frees. */
static uint32_t tally_apps(struct core *k, const sched_model *sm, bool (*in)(const sjob *)) {
    const uint64_t stamp = ++k->apps_stamp;
    uint32_t apps = 0;
    for (const sjob *o = k->jobs; o; o = o->next) {
        if (!o->counter || o->model != sm || (in && !in(o))) continue;
        app_count *c = o->counter;
        if (c->stamp != stamp) {
            c->stamp = stamp;
            c->tally = 0;
            apps++;
        }
        c->tally++;
    }
    return apps;
}

/* What the last tally_apps gave app's counter (0 when it has none, or was not met). */
static uint32_t tallied(const struct core *k, const app_count *c) {
    return c && c->stamp == k->apps_stamp ? c->tally : 0;
}

/* A full queue of sm: make room for app's request by refusing the newest waiting request of the
 * app holding the most beyond its share. Returns true when room was made. */
static bool queue_make_room(struct core *k, sched_model *sm, const char *app, uint32_t limit) {
    uint32_t apps = tally_apps(k, sm, NULL);
    const app_count *mine = counter_find(k, app);
    if (!tallied(k, mine)) apps++; /* the newcomer's, not in the queue yet */
    const uint32_t share = limit / apps ? limit / apps : 1;
    if (tallied(k, mine) >= share) return false;
    /* The app holding the most, and its newest request that has not started (and that no actor
     * works on). */
    const app_count *fattest = NULL;
    for (const app_count *c = k->apps; c; c = c->next)
        if (tallied(k, c) > share && (!fattest || tallied(k, c) > tallied(k, fattest))) fattest = c;
    if (!fattest) return false;
    sjob *victim = NULL;
    for (sjob *o = k->jobs; o; o = o->next)
        if (o->counter == fattest && o->model == sm && !o->task &&
            (o->phase == SJOB_WAIT_MODEL || o->phase == SJOB_READY))
            victim = o;
    if (!victim) return false;
    char holder[64];
    snprintf(holder, sizeof holder, "%s", fattest->app[0] ? fattest->app : "(default)");
    const uint32_t most = tallied(k, fattest);
    const bool waited_for_model = victim->phase == SJOB_WAIT_MODEL;
    log_info("queue share: a waiting request makes room for another app's",
             LOG_STR("model", sm->name), LOG_STR("app", holder), LOG_UINT("held", most),
             LOG_UINT("share", share), LOG_UINT("id", victim->j->id));
    sched_finish_error(k, victim, CORRAL_RESOURCE_EXHAUSTED,
                       "model '%s' is full and app '%s' held %u of its %u places, more than its "
                       "share of %u (limits.queue_per_model): room was made for another app",
                       sm->name, holder, most, limit, share);
    if (waited_for_model) residency_forget_load(k, sm);
    return true;
}

bool apps_admit_generate(struct core *k, job *j, sched_model *sm, cfg_priority *prio) {
    const core_generate *g = &j->req.generate;
    const app_rules r = apps_rules(k, j);
    const cfg *c = core_cfg(k);
    if (g->priority) {
        if ((cfg_priority)g->priority > r.ceiling) {
            apps_deny(j, "max_priority", sm->name,
                      "app '%s' may not ask for priority %s: its ceiling is %s "
                      "(apps[].max_priority)",
                      r.name, cfg_priority_name((cfg_priority)g->priority),
                      cfg_priority_name(r.ceiling));
            return false;
        }
        *prio = (cfg_priority)g->priority;
    } else {
        /* The model's class, within the app's ceiling: a request that asked for nothing is not
         * refused for what the model's entry says. */
        *prio = sm->cfg->priority < r.ceiling ? sm->cfg->priority : r.ceiling;
    }
    if (r.max_tokens && g->sampling.has_max_tokens && g->sampling.max_tokens > r.max_tokens) {
        apps_deny(j, "max_tokens", sm->name,
                  "app '%s' may ask for at most %u tokens, not %u (apps[].max_tokens)", r.name,
                  r.max_tokens, g->sampling.max_tokens);
        return false;
    }
    if (g->session[0] && session_of_another_app(k, g->session, j->app)) {
        apps_deny(j, "sessions", sm->name, SESSION_DENIED_FMT, g->session);
        return false;
    }
    app_count *a = counter_find(k, j->app);
    const uint32_t in_flight = a ? a->n : 0;
    if (r.max_concurrent && in_flight >= r.max_concurrent) {
        apps_deny(j, "max_concurrent", sm->name,
                  "app '%s' has %u requests in flight, its most (apps[].max_concurrent)", r.name,
                  in_flight);
        return false;
    }
    if (in_flight >= (uint32_t)c->queue_per_app) {
        job_emit_error(j, CORRAL_RESOURCE_EXHAUSTED,
                       "app '%s' has %u requests queued (limits.queue_per_app)", r.name, in_flight);
        return false;
    }
    if (sm->n_queued >= (uint32_t)c->queue_per_model &&
        !queue_make_room(k, sm, j->app, (uint32_t)c->queue_per_model)) {
        job_emit_error(j, CORRAL_RESOURCE_EXHAUSTED,
                       "model '%s' has %u requests queued (limits.queue_per_model)", sm->name,
                       sm->n_queued);
        return false;
    }
    return true;
}

/* ---- active slots -------------------------------------------------------------------------- */

static bool is_running(const sjob *o) {
    return o->phase == SJOB_ACTIVE && !atomic_load(&o->j->paused);
}

/* Running, or on its way to a slot: admitted, being prepared, ready, getting its session back
 * (those phases are short while its model is resident). Not paused, not waiting to retry for
 * memory. */
static bool is_competing(const sjob *o) {
    return is_running(o) || (o->phase != SJOB_ACTIVE && !atomic_load(&o->j->paused) &&
                             !(o->retry_at_us && sched__mono_us() < o->retry_at_us));
}

bool apps_slot_fair(struct core *k, const sjob *sj, uint32_t slots) {
    /* The others' requests on their way count as waiting: one that is still being prepared when
     * a slot frees would otherwise lose it to an app that already runs its share. */
    const sched_model *sm = sj->model;
    const uint32_t apps = tally_apps(k, sm, is_competing);
    if (apps < 2 || !sj->counter) return true;
    uint32_t mine = 0;
    bool others_wait = false;
    for (const sjob *o = k->jobs; o; o = o->next) {
        if (!o->counter || o->model != sm || !is_competing(o)) continue;
        if (o->counter == sj->counter)
            mine += is_running(o);
        else if (!is_running(o) && o->priority >= sj->priority)
            others_wait = true;
    }
    if (!others_wait) return true;
    const uint32_t share = slots / apps ? slots / apps : 1;
    return mine < share;
}
