/*
 * config_gen.c — configuration generations: a configuration with its sanitizer profiles built,
 * kept alive while jobs admitted under it run (see sched_impl.h).
 *
 * Profiles are built when a configuration is taken in (at start and on reload): plugins are
 * loaded and every step's settings checked then, so a bad profile stops startup, or makes a
 * reload be refused, with a message naming it — never a request.
 */
#include <stdlib.h>
#include <string.h>

#include "sched_impl.h"

static void profiles_free(cfg_gen *g) {
    for (size_t i = 0; i < g->n_profiles; i++) policy_profile_destroy(&g->profiles[i]);
    free(g->profiles);
    g->profiles = NULL;
    g->n_profiles = 0;
}

/* Build the profile of one config entry. */
static policy_profile *profile_build(const cfg_sanitizer *cs, corral_error *err) {
    if (cs->n_steps > POLICY_MAX_STEPS) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "sanitizer '%s' has %zu steps; at most %d",
                         cs->name, cs->n_steps, POLICY_MAX_STEPS);
        return NULL;
    }
    policy_step_desc steps[POLICY_MAX_STEPS];
    corral_policy_kv *params[POLICY_MAX_STEPS] = {0};
    policy_profile *p = NULL;
    bool ok = true;
    for (size_t k = 0; ok && k < cs->n_steps; k++) {
        const cfg_policy_step *cstep = &cs->steps[k];
        if (cstep->n_params && !(params[k] = calloc(cstep->n_params, sizeof *params[k]))) {
            corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            ok = false;
            break;
        }
        for (size_t q = 0; q < cstep->n_params; q++)
            params[k][q] =
                (corral_policy_kv){.key = cstep->params[q].key, .value = cstep->params[q].value};
        steps[k] = (policy_step_desc){.kind = cstep->kind,
                                      .path = cstep->path,
                                      .params = params[k],
                                      .n_params = cstep->n_params};
    }
    if (ok) p = policy_profile_new(cs->name, steps, cs->n_steps, err);
    for (size_t k = 0; k < POLICY_MAX_STEPS; k++) free(params[k]);
    return p;
}

cfg_gen *cfg_gen_new(cfg *c, corral_error *err) {
    cfg_gen *g = calloc(1, sizeof *g);
    if (!g) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_destroy(&c);
        return NULL;
    }
    g->c = c;
    if (c->n_sanitizers && !(g->profiles = calloc(c->n_sanitizers, sizeof *g->profiles))) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_gen_destroy(&g);
        return NULL;
    }
    for (size_t i = 0; i < c->n_sanitizers; i++) {
        g->profiles[i] = profile_build(&c->sanitizers[i], err);
        if (!g->profiles[i]) {
            cfg_gen_destroy(&g);
            return NULL;
        }
        g->n_profiles++;
    }
    if (!(g->auth = auth_table_new(c, err))) cfg_gen_destroy(&g);
    return g;
}

void cfg_gen_destroy(cfg_gen **pg) {
    if (!pg || !*pg) return;
    profiles_free(*pg);
    auth_table_release(&(*pg)->auth);
    cfg_destroy(&(*pg)->c);
    free(*pg);
    *pg = NULL;
}

const policy_profile *cfg_gen_profile(const cfg_gen *g, const char *name) {
    for (size_t i = 0; name && i < g->n_profiles; i++)
        if (strcmp(policy_profile_name(g->profiles[i]), name) == 0) return g->profiles[i];
    return NULL;
}

corral_status core_check_config(const cfg *c, corral_error *err) {
    /* Build the profiles of a copy's worth of entries without taking c: borrow it. */
    cfg_gen g = {.c = (cfg *)c};
    if (c->n_sanitizers && !(g.profiles = calloc(c->n_sanitizers, sizeof *g.profiles)))
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    corral_status st = CORRAL_OK;
    for (size_t i = 0; i < c->n_sanitizers && st == CORRAL_OK; i++) {
        g.profiles[i] = profile_build(&c->sanitizers[i], err);
        if (g.profiles[i])
            g.n_profiles++;
        else
            st = err->status;
    }
    profiles_free(&g);
    if (st == CORRAL_OK) {
        auth_table *t = auth_table_new(c, err);
        if (!t) st = err->status;
        auth_table_release(&t);
    }
    return st;
}
