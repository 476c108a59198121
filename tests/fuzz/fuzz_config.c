/*
 * fuzz_config.c — corrald's YAML configuration loader (daemon/config.h, cfg_load_string) on
 * arbitrary text: libyaml's parser, then config.c's table-driven walk, defaults, range checks and
 * whole-file checks.
 *
 * Relative model paths resolve against the current directory; scripts/fuzz runs the fuzzers from
 * the repository root, so the seeds name ../shared/models/... and reach the checks that follow a
 * model file that exists.
 *
 * Invariants: a failure has a status the header documents and a message naming the document
 * (every content error is "fuzz.yaml:line:column: ..."); a configuration that loads is
 * self-consistent — each model, app and sanitizer is found again by its name, every model has an
 * absolute path, every app's models are configured ones, watermarks are ordered — and frees clean.
 */
#include "config.h"
#include "corral/curve.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static void check_config(const cfg *c) {
    for (size_t i = 0; i < c->n_models; i++) {
        const cfg_model *m = &c->models[i];
        FUZZ_CHECK(m->name && cfg_find_model(c, m->name) == m, "model %zu not found by name", i);
        FUZZ_CHECK(m->path && m->path[0] == '/', "model '%s' path '%s' is not absolute", m->name,
                   m->path ? m->path : "(null)");
        FUZZ_CHECK(m->context >= 0 && m->ttl_ms >= 0, "model '%s' negative bounds", m->name);
        FUZZ_CHECK(cfg_priority_name(m->priority) != NULL, "model '%s' priority %d", m->name,
                   (int)m->priority);
        for (size_t k = 0; k < m->n_adapters; k++)
            FUZZ_CHECK(m->adapters[k].path != NULL, "model '%s' adapter %zu", m->name, k);
        if (m->sanitizer)
            FUZZ_CHECK(cfg_find_sanitizer(c, m->sanitizer) != NULL,
                       "model '%s' names an unknown sanitizer '%s'", m->name, m->sanitizer);
    }
    for (size_t i = 0; i < c->n_apps; i++) {
        const cfg_app *a = &c->apps[i];
        FUZZ_CHECK(a->name && cfg_find_app(c, a->name) == a, "app %zu not found by name", i);
        for (size_t k = 0; k < a->n_models; k++)
            FUZZ_CHECK(cfg_app_allows_model(a, a->models[k]), "app '%s' model %zu", a->name, k);
        FUZZ_CHECK(cfg_priority_name(a->max_priority) != NULL, "app '%s' priority", a->name);
        /* What auth tables and job->app rely on (daemon/auth.c). */
        FUZZ_CHECK(strlen(a->name) < 64 && a->name[0] != '(', "app name '%s'", a->name);
        for (size_t k = 0; k < a->n_curve_keys; k++)
            FUZZ_CHECK(curve_key_valid(a->curve_keys[k]), "app '%s' curve key %zu", a->name, k);
    }
    for (size_t i = 0; i < c->n_sanitizers; i++) {
        const cfg_sanitizer *s = &c->sanitizers[i];
        FUZZ_CHECK(s->name && cfg_find_sanitizer(c, s->name) == s, "sanitizer %zu by name", i);
        for (size_t k = 0; k < s->n_steps; k++) {
            FUZZ_CHECK(s->steps[k].kind != NULL, "sanitizer '%s' step %zu kind", s->name, k);
            for (size_t j = 0; j < s->steps[k].n_params; j++)
                FUZZ_CHECK(s->steps[k].params[j].key && s->steps[k].params[j].value,
                           "sanitizer '%s' step %zu param %zu", s->name, k, j);
        }
    }
    for (size_t i = 0; i < c->n_listen; i++) FUZZ_CHECK(c->listen[i] != NULL, "listen %zu", i);
    FUZZ_CHECK(c->low_watermark <= c->high_watermark, "watermarks %g > %g", c->low_watermark,
               c->high_watermark);
    FUZZ_CHECK(c->evict_policy != NULL, "no eviction policy");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    cfg *c = cfg_load_string((const char *)data, size, NAME, &err);
    if (!c) {
        FUZZ_CHECK(err.status == CORRAL_INVALID_ARGUMENT || err.status == CORRAL_OUT_OF_MEMORY,
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(err.status != CORRAL_INVALID_ARGUMENT ||
                       strncmp(err.message, NAME ":", sizeof NAME) == 0,
                   "message does not start with the document's name: %s", err.message);
        return 0;
    }
    check_config(c);
    cfg_destroy(&c);
    FUZZ_CHECK(c == NULL, "cfg_destroy left the pointer");
    return 0;
}
