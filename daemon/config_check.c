/*
 * config_check.c — the checks of a configuration that read the models it names
 * (cfg_check_models, config.h), apart from config.c, which reads only YAML.
 *
 * A configuration that parses can still fail every request: a path that names a README or a
 * GGUF v1 file, a `template: bogus`, a `context: 99999` on a model trained for 2048. Those used to
 * show only when a request loaded the model. corrald now opens each model file at start, at a
 * reload and under --check-config exactly as a load does — the GGUF reader checks the magic, the
 * version, every count, offset and size; the engine checks the architecture, the hyperparameters,
 * every tensor it needs (present, shaped, of a type it computes with) and the vocabulary — but in
 * reference mode, so nothing is rearranged and no weight is read: the file is mapped and only its
 * header, metadata and vocabulary pages are touched. Each problem is reported with the place of
 * the key it is about (the `path`, `context` or `template` value), and a template name that is not
 * known gets the closest one that is.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "corral/chat.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/suggest.h"
#include "lora.h"

/* Problems go to err (the first) and the report (each). */
typedef struct check_state {
    const cfg *c;
    const char *name; /* the file's, for messages */
    cfg_report *report;
    corral_error *err;
    size_t n;
} check_state;

static void problem(check_state *cs, const cfg_model *m, cfg_pos at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void problem(check_state *cs, const cfg_model *m, cfg_pos at, const char *fmt, ...) {
    char what[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char line[CORRAL_ERROR_MESSAGE_MAX + 256]; /* (cut to the message size when kept) */
    snprintf(line, sizeof line, "%s:%d:%d: model '%s': %s", cs->name, at.line, at.col, m->name,
             what);
    cfg_report_problem(cs->report, cs->err, &cs->n, line);
}

/* A `template` name the engine does not know: the known names, and the closest of them. */
static void check_template(check_state *cs, const cfg_model *m) {
    if (!m->chat_template ||
        chat_template_from_name(m->chat_template, NULL) != CHAT_TEMPLATE_UNKNOWN)
        return;
    const char *names[CHAT_TEMPLATE_COUNT + 1];
    size_t n = 0;
    char known[512] = "";
    size_t len = 0;
    for (int t = 0; t < CHAT_TEMPLATE_COUNT; t++) {
        const char *name = chat_template_name((chat_template)t);
        if (!name) continue;
        names[n++] = name;
        if (len < sizeof known)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "", name);
    }
    names[n++] = "mistral-instruct"; /* an alias chat_template_from_name takes */
    char hint[128] = "";
    suggest_append(hint, sizeof hint, m->chat_template, names, n);
    problem(cs, m, m->at_template, "unknown chat template '%s'%s (known: %s)", m->chat_template,
            hint, known);
}

/* The model file as a load would open it (reference mode: nothing rearranged, no weight read),
 * `context` against what it was trained for, and each adapter against it. */
static void check_file(check_state *cs, const cfg_model *m) {
    const model_params mp = {.compute = MODEL_COMPUTE_REFERENCE};
    corral_error why;
    model *md = model_load(m->path, &mp, &why);
    if (!md) {
        problem(cs, m, m->at_path, "%s", why.message);
        return;
    }
    const model_hparams *hp = model_get_hparams(md);
    if (m->context > 0 && (uint64_t)m->context > hp->n_ctx_train)
        problem(cs, m, m->at_context,
                "context %lld is more than the %u positions %s was trained for (%s); 0 takes "
                "the model's own",
                (long long)m->context, hp->n_ctx_train, m->path, hp->arch);
    for (size_t i = 0; i < m->n_adapters; i++) {
        if (!m->adapters[i].path) continue; /* its entry failed: reported by the loader */
        lora_adapter *a = lora_adapter_open(m->adapters[i].path, model_get_gguf(md), &why);
        if (!a)
            problem(cs, m, m->at, "adapter %s does not fit %s: %s", m->adapters[i].path, m->path,
                    why.message);
        lora_adapter_destroy(&a);
    }
    model_destroy(&md);
}

corral_status cfg_check_models(const cfg *c, const char *name, cfg_report *report,
                               corral_error *err) {
    check_state cs = {.c = c,
                      .name = name             ? name
                              : c->source_path ? c->source_path
                                               : "(config)",
                      .report = report,
                      .err = err};
    for (size_t i = 0; i < c->n_models; i++) {
        const cfg_model *m = &c->models[i];
        if (!m->name || !m->path) continue; /* its entry failed: reported by the loader */
        check_template(&cs, m);
        /* A file that is not there was reported by the loader. */
        if (access(m->path, F_OK) == 0) check_file(&cs, m);
    }
    return cs.n ? CORRAL_INVALID_ARGUMENT : CORRAL_OK;
}
