/*
 * prepare.c — what a request needs before its first compute step and that depends only on the
 * request and its (resident) model: a Generate's sampling parameters (the request's, else the
 * model's configured defaults, else the engine's), its sanitizer profile run over every piece of
 * user text, the prompt's token ids (a raw prompt, or a chat rendered with the model's template),
 * and its output constraint; a Tokenize's ids and pieces.
 *
 * None of this touches the KV caches, sessions or the memory budget: it runs on the preparer
 * actor, apart from the step loop, so that a huge prompt or a complex constraint never stalls the
 * other requests. It reads the job (its request, its configuration entry) and its model's
 * tokenizer and policy vocabulary, which stay put while the job holds the model.
 */
#include <stdlib.h>
#include <string.h>

#include "corral/fault.h"
#include "corral/log.h"
#include "corral/prompt.h"
#include "corral/sanitize.h"
#include "corral/tokenizer.h"
#include "sched_impl.h"

/* Merge request, model defaults and engine defaults into generation parameters; validate. */
static corral_status build_params(sjob *sj, corral_error *err) {
    const core_generate *g = &sj->j->req.generate;
    const core_sampling *q = &g->sampling;
    const sched_model *sm = sj->model;
    const cfg_sampling *d = &sj->entry->defaults;
    gen_params *gp = &sj->params;
    *gp = gen_params_default();
    sampler_params *sp = &gp->sampling;
#define PICK(field, cast)               \
    do {                                \
        if (q->has_##field)             \
            sp->field = (cast)q->field; \
        else if (d->has_##field)        \
            sp->field = (cast)d->field; \
    } while (0)
    PICK(temperature, float);
    PICK(top_k, int32_t);
    PICK(top_p, float);
    PICK(min_p, float);
    PICK(repeat_penalty, float);
    PICK(presence_penalty, float);
    PICK(frequency_penalty, float);
    PICK(penalty_last_n, int32_t);
#undef PICK
    /* No seed: a fresh one, so that two requests do not sample alike by accident. */
    sp->seed = q->has_seed ? q->seed
                           : ((uint64_t)sched__mono_us() * 0x9E3779B97F4A7C15ull) ^
                                 (sj->j->id << 17) ^ (uint64_t)sj->j->received_us;
    corral_status st = sampler_validate_params(sp, err);
    if (st != CORRAL_OK) return st;
    uint64_t mt = q->has_max_tokens
                      ? q->max_tokens
                      : (d->has_max_tokens ? (uint64_t)d->max_tokens : SCHED_DEFAULT_MAX_TOKENS);
    /* A request naming no limit gets at most its app's (one naming more was refused). */
    if (!q->has_max_tokens && sj->token_cap && mt > sj->token_cap) mt = sj->token_cap;
    if (mt == 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "max_tokens must be at least 1");
    if (mt > sm->context)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "max_tokens %llu exceeds the context of model '%s' (%u)",
                                (unsigned long long)mt, sm->name, sm->context);
    sj->max_tokens = (uint32_t)mt;
    if (g->n_stop > 16)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "at most 16 stop strings, got %zu",
                                g->n_stop);
    for (size_t i = 0; i < g->n_stop; i++)
        if (!g->stop[i][0] || strlen(g->stop[i]) > 256)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "stop string %zu must be 1 to 256 bytes", i);
    gp->max_tokens = sj->max_tokens;
    gp->stop = g->stop;
    gp->n_stop = g->n_stop;
    if (g->top_logprobs > GEN_TOP_LOGPROBS_MAX)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "top_logprobs must be at most %d",
                                GEN_TOP_LOGPROBS_MAX);
    gp->logprobs = g->logprobs || g->top_logprobs > 0;
    gp->top_logprobs = g->top_logprobs;
    return CORRAL_OK;
}

/* The profile a job runs under: the request's, else its app's, else its model's; none when none
 * names one. The request's name was checked at admission. */
static corral_status find_profile(sjob *sj, corral_error *err) {
    const char *name = sj->j->req.generate.sanitizer[0] ? sj->j->req.generate.sanitizer : NULL;
    const cfg *c = sj->gen->c;
    const cfg_app *app = cfg_find_app(c, sj->j->app[0] ? sj->j->app : c->default_app);
    if (!name && app) name = app->sanitizer;
    if (!name) name = sj->entry->sanitizer;
    sj->profile = cfg_gen_profile(sj->gen, name);
    if (name && !sj->profile)
        return corral_error_set(err, CORRAL_NOT_FOUND, "sanitizer profile '%s' is not configured",
                                name);
    return CORRAL_OK;
}

/* The index of the message after the turn that starts at `first`: one message, and the replies
 * that follow it, so that what is kept starts with a user's message (templates such as Gemma's
 * want the roles to alternate from a user's). The last message is never passed. */
static size_t chat_next_turn(const core_generate *g, size_t first, size_t n) {
    size_t next = first + 1;
    while (next + 1 < n && strcmp(g->messages[next].role, "assistant") == 0) next++;
    return next;
}

/* Render the chat's messages 0..n_sys and first..n through the template and tokenize them into
 * *ids (*n; malloc'ed). */
static corral_status chat_render(sjob *sj, chat_template tmpl, char **clean, size_t n_sys,
                                 size_t first, chat_message *msgs, int32_t **ids, size_t *n,
                                 corral_error *err) {
    const core_generate *g = &sj->j->req.generate;
    size_t k = 0;
    for (size_t i = 0; i < n_sys; i++)
        msgs[k++] = (chat_message){.role = g->messages[i].role, .content = clean[i]};
    for (size_t i = first; i < g->n_messages; i++)
        msgs[k++] = (chat_message){.role = g->messages[i].role, .content = clean[i]};
    *ids = NULL;
    sj->chat_renders++;
    const corral_status st =
        prompt_tokenize_chat(model_get_tokenizer(sj->model->m), tmpl, msgs, k, ids, n, err);
    if (st != CORRAL_OK) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}

/* Render and tokenize the chat from *first (chat_render). Under context_overflow truncate_oldest,
 * when the prompt and a reserve for the answer — max_tokens, at most a quarter of the context —
 * do not fit, the oldest turns go (*first moves on, turn by turn) until they do, or until only
 * the system messages and the last message are left; whether that fits is prepare_generate's
 * check. Dropping whole turns from the front keeps every kept message's text as it was, so a
 * session's cache still matches up to the first dropped message (the system prompt) and is
 * recomputed from there.
 *
 * The fewest turns to drop are found by doubling, then halving, the turns dropped: a chat of T
 * turns is tokenized O(log T) times, not once per turn dropped (a hostile chat of many tiny
 * turns made that quadratic, and held the preparer, which every request goes through). Fewer
 * turns take fewer tokens (up to the tokenizer's merges at the cut), so this finds the start that
 * dropping one turn at a time would, and always one that fits (or the last). */
static corral_status chat_fit(sjob *sj, chat_template tmpl, char **clean, size_t n_sys,
                              size_t *first, chat_message *msgs, int32_t **ids, size_t *n,
                              corral_error *err) {
    const core_generate *g = &sj->j->req.generate;
    const sched_model *sm = sj->model;
    const size_t n_texts = g->n_messages;
    const uint32_t reserve = sj->max_tokens < sm->context / 4 ? sj->max_tokens : sm->context / 4;
    corral_status st = chat_render(sj, tmpl, clean, n_sys, *first, msgs, ids, n, err);
    if (st != CORRAL_OK || sj->entry->context_overflow != CFG_OVERFLOW_TRUNCATE_OLDEST ||
        *n + reserve <= sm->context || *first + 1 >= n_texts)
        return st;
    /* Where each turn starts, from *first; the last start is the last message. */
    size_t *starts = malloc(n_texts * sizeof *starts);
    if (!starts) {
        free(*ids);
        *ids = NULL;
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    size_t n_starts = 0;
    for (size_t at = *first;; at = chat_next_turn(g, at, n_texts)) {
        starts[n_starts++] = at;
        if (at + 1 >= n_texts) break;
    }
    /* starts[bad] does not fit (starts[0] did not); starts[good] fits, or is the last. */
    size_t bad = 0, good = n_starts - 1, step = 1;
    int32_t *good_ids = NULL;
    size_t good_n = 0;
    while (bad + 1 < good) {
        /* Doubling until a start fits, then halving between the two. */
        const size_t probe = !good_ids && step < good - bad ? bad + step : bad + (good - bad) / 2;
        int32_t *probe_ids;
        size_t probe_n;
        st = chat_render(sj, tmpl, clean, n_sys, starts[probe], msgs, &probe_ids, &probe_n, err);
        if (st != CORRAL_OK) break;
        if (probe_n + reserve <= sm->context) {
            free(good_ids);
            good_ids = probe_ids, good_n = probe_n, good = probe;
        } else {
            free(probe_ids);
            bad = probe;
            step *= 2;
        }
    }
    free(*ids);
    *ids = NULL;
    if (st == CORRAL_OK && !good_ids)
        st = chat_render(sj, tmpl, clean, n_sys, starts[good], msgs, &good_ids, &good_n, err);
    if (st == CORRAL_OK) {
        *first = starts[good];
        *ids = good_ids, *n = good_n;
    } else {
        free(good_ids);
    }
    free(starts);
    return st;
}

/* Run the profile over every piece of user text (the prompt, or each message's content) and
 * tokenize what comes out. The report of the last piece (or the first rejection) goes to the job:
 * it is part of Done, or of the Error's message. */
static corral_status tokenize_input(sjob *sj, int32_t **ids, size_t *n, corral_error *err) {
    const core_generate *g = &sj->j->req.generate;
    const sched_model *sm = sj->model;
    const tokenizer *tok = model_get_tokenizer(sm->m);
    const size_t n_texts = g->n_messages ? g->n_messages : 1;
    char **clean = calloc(n_texts, sizeof *clean);
    if (!clean) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    corral_status st = CORRAL_OK;
    sanitize_report report = {0};
    for (size_t i = 0; i < n_texts && st == CORRAL_OK; i++) {
        const char *text = g->n_messages ? g->messages[i].content : g->prompt;
        const size_t text_len = g->n_messages ? g->messages[i].content_len : g->prompt_len;
        size_t len;
        st = policy_sanitize(sj->profile, sm->pv, text, text_len, &clean[i], &len, &report, err);
        if (st == CORRAL_OK && strlen(clean[i]) != len)
            st = corral_error_set(err, CORRAL_SANITIZER_REJECTED,
                                  "the input contains NUL bytes (message %zu)", i);
    }
    if (sj->profile) {
        char line[512];
        sanitize_report_format(&report, line, sizeof line);
        /* The report outlives the model's arena (it goes with the final event): default arena. */
        const unsigned scope = mem_scope_default();
        free(sj->sanitizer_report);
        sj->sanitizer_report = strdup(line);
        mem_scope_leave(scope);
        if (st == CORRAL_SANITIZER_REJECTED) {
            /* Keep the rejection first, then what each step saw. */
            char message[CORRAL_ERROR_MESSAGE_MAX];
            snprintf(message, sizeof message, "%s", err->message);
            corral_error_set(err, st, "%.300s (report: %.180s)", message, line);
        }
    }
    /* A chat that outgrows the context (context_overflow: truncate_oldest) leaves its oldest
     * turns out: messages [n_sys, first) are dropped, the leading system messages and the last
     * message always stay. See chat_fit. */
    const bool truncate =
        g->n_messages > 0 && sj->entry->context_overflow == CFG_OVERFLOW_TRUNCATE_OLDEST;
    size_t n_sys = 0;
    while (g->n_messages && n_sys + 1 < n_texts && strcmp(g->messages[n_sys].role, "system") == 0)
        n_sys++;
    size_t first = n_sys;
    if (st == CORRAL_OK) {
        /* Limits before work: a text whose every token were as long as the longest piece would
         * still overflow the context is refused without tokenizing it (a chat that may be
         * truncated first leaves out what cannot fit by that measure). */
        size_t bytes = 0;
        for (size_t i = 0; i < n_texts; i++) bytes += strlen(clean[i]);
        const size_t can_fit = (size_t)sm->context * tok_max_piece_len(tok);
        while (truncate && bytes > can_fit && first + 1 < n_texts) {
            const size_t next = chat_next_turn(g, first, n_texts);
            for (size_t i = first; i < next; i++) bytes -= strlen(clean[i]);
            first = next;
        }
        if (bytes > can_fit)
            st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                  "the prompt has %zu bytes: more than the context of model '%s' "
                                  "(%u tokens of at most %zu bytes) can hold",
                                  bytes, sm->name, sm->context, tok_max_piece_len(tok));
    }
    if (st == CORRAL_OK) {
        if (g->n_messages == 0) {
            st = prompt_tokenize_text(tok, clean[0], strlen(clean[0]), ids, n, err);
        } else {
            chat_template tmpl = sm->tmpl;
            if (g->template_name[0]) {
                tmpl = chat_template_from_name(g->template_name, err);
                if (tmpl == CHAT_TEMPLATE_UNKNOWN) st = err->status = CORRAL_INVALID_ARGUMENT;
            }
            chat_message *msgs = st == CORRAL_OK ? malloc(n_texts * sizeof *msgs) : NULL;
            if (st == CORRAL_OK && !msgs)
                st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            if (msgs) st = chat_fit(sj, tmpl, clean, n_sys, &first, msgs, ids, n, err);
            free(msgs);
        }
    }
    sj->dropped_messages = (uint32_t)(first - n_sys);
    for (size_t i = 0; i < n_texts; i++) free(clean[i]);
    free(clean);
    return st;
}

static corral_status prepare_generate(sjob *sj, const char **rule, corral_error *err) {
    sched_model *sm = sj->model;
    const core_generate *req = &sj->j->req.generate;
    corral_status st;
    if (req->constraint && req->constraint_len && req->json_schema && req->json_schema_len)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "constraint (a regex) and json_schema cannot be used together: "
                                "give one");
    if ((st = build_params(sj, err)) != CORRAL_OK) return st;
    if ((st = find_profile(sj, err)) != CORRAL_OK) return st;
    /* The request's own state (its prompt, its output buffer, its compiled constraint) is the
     * request's, not the model's: in the model's arena it counted against memory.limit outside
     * the budget's plans (a compile may take up to 32 MiB for a job that then waits in the queue),
     * and the models' total went over the limit. */
    const unsigned scope = mem_scope_default();
    size_t n_prompt = 0;
    st = tokenize_input(sj, &sj->prompt, &n_prompt, err);
    if (st == CORRAL_OK && n_prompt == 0)
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "the prompt is empty and model '%s' adds no BOS token", sm->name);
    if (st == CORRAL_OK && n_prompt >= sm->context)
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "the prompt has %zu tokens; the context of model '%s' holds %u%s",
                              n_prompt, sm->name, sm->context,
                              sj->j->req.generate.n_messages == 0 ? ""
                              : sj->entry->context_overflow == CFG_OVERFLOW_ERROR
                                  ? " (its context_overflow is error: the chat is not truncated)"
                                  : " (even with only its system messages and its last message)");
    if (st == CORRAL_OK && sj->dropped_messages)
        log_debug("chat truncated to fit the context", LOG_UINT("id", sj->j->id),
                  LOG_STR("model", sm->name), LOG_UINT("dropped", sj->dropped_messages),
                  LOG_UINT("prompt", n_prompt), LOG_UINT("context", sm->context),
                  LOG_UINT("renders", sj->chat_renders));
    sj->n_prompt = (uint32_t)n_prompt;
    if (st == CORRAL_OK) {
        sj->cap_generated = sj->max_tokens;
        sj->generated = malloc(sj->max_tokens * sizeof *sj->generated);
        if (!sj->generated) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    if (st == CORRAL_OK) {
        /* The output restrictions: the request's regex or JSON schema (compiled here, off the
         * compute thread, and cached per model) and the profile's generation hooks. */
        const core_generate *g = &sj->j->req.generate;
        const bool schema = g->json_schema && g->json_schema_len;
        sj->pg = policy_gen_new_as(sj->profile, sm->pv,
                                   schema ? CONSTRAINT_JSON_SCHEMA : CONSTRAINT_REGEX,
                                   schema ? g->json_schema : g->constraint,
                                   schema ? g->json_schema_len : g->constraint_len, err);
        if (!sj->pg) {
            st = err->status;
            if (st == CORRAL_RESOURCE_EXHAUSTED) *rule = JOB_RULE_OUTPUT_CONSTRAINT;
        } else
            sj->params.processor = policy_gen_processor(sj->pg);
    }
    mem_scope_leave(scope);
    return st;
}

static corral_status prepare_tokenize(sjob *sj, core_reply **out, corral_error *err) {
    const job *j = sj->j;
    const tokenizer *tok = model_get_tokenizer(sj->model->m);
    const uint32_t flags = j->req.tokenize.add_special ? TOK_ADD_SPECIAL : 0;
    const char *text = j->req.tokenize.text;
    const size_t len = j->req.tokenize.text_len;
    core_reply *r = core_reply_new(CORE_TOKENIZE);
    if (!r) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    /* The reply outlives the model's arena: default arena. */
    const unsigned scope = mem_scope_default();
    size_t n = 0;
    corral_status st = tok_encode(tok, text, len, flags, NULL, 0, &n, err);
    if (st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED) {
        r->ids = malloc((n ? n : 1) * sizeof *r->ids);
        r->pieces = calloc(n ? n : 1, sizeof *r->pieces);
        st = r->ids && r->pieces ? tok_encode(tok, text, len, flags, r->ids, n, &n, err)
                                 : corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    r->n_ids = st == CORRAL_OK ? n : 0;
    for (size_t i = 0; st == CORRAL_OK && i < n; i++) {
        size_t piece_len;
        const char *p = tok_token_text(tok, r->ids[i], &piece_len);
        if (!(r->pieces[i] = malloc(piece_len + 1))) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            break;
        }
        memcpy(r->pieces[i], p, piece_len);
        r->pieces[i][piece_len] = '\0';
    }
    mem_scope_leave(scope);
    if (st != CORRAL_OK) {
        core_reply_destroy(&r);
        return st;
    }
    *out = r;
    return CORRAL_OK;
}

/* ---- the task -------------------------------------------------------------------------------- */

typedef struct prepare_task {
    core_task t;
    sjob *sj;
    corral_status status;
    corral_error err;
    const char *rule; /* job.error_rule of a failure, or NULL */
    bool faulted;     /* reading the model's mapped file failed: the model is broken */
} prepare_task;

/* Tokenizing reads the vocabulary's strings, which are in the model's mapped file: a file
 * truncated under us faults here (fault.h). The jump leaves what it skipped in the model's arena
 * (freed with the model, which is broken now) and the job's own buffers (freed with the job). */
static void prepare_run(actor_task *base) {
    prepare_task *t = (prepare_task *)base;
    sjob *sj = t->sj;
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        if (sj->j->req.kind == CORE_TOKENIZE)
            t->status = prepare_tokenize(sj, &sj->answer, &t->err);
        else
            t->status = prepare_generate(sj, &t->rule, &t->err);
        fault_guard_leave(&g);
    } else {
        (void)mem_scope_default(); /* whatever scope the jump left behind */
        t->faulted = true;
        t->status = model_note_fault(sj->model->m, &g.info, &t->err);
    }
}

static void prepare_finish(struct core *k, core_task *ct) {
    prepare_task *t = (prepare_task *)ct;
    sjob *sj = t->sj;
    sj->task = NULL;
    if (!t->t.base.ran) corral_error_set(&t->err, CORRAL_UNAVAILABLE, "corrald is shutting down");
    const corral_status st = t->t.base.ran ? t->status : CORRAL_UNAVAILABLE;
    if (t->faulted) residency_break(k, sj->model, t->err.message);
    if (st != CORRAL_OK) {
        sj->j->error_rule = t->rule;
        sched_finish_error(k, sj, t->err.status, "%s", t->err.message);
    } else if (sj->j->req.kind == CORE_TOKENIZE) {
        core_reply *r = sj->answer;
        sj->answer = NULL;
        sched_finish_reply(k, sj, r);
    } else {
        sj->phase = SJOB_READY;
        sj->retry_at_us = 0;
        sj->memory_wait_until_us = 0;
    }
    free(t);
}

void prepare_start(struct core *k, sjob *sj) {
    prepare_task *t = calloc(1, sizeof *t);
    if (!t) {
        sched_finish_error(k, sj, CORRAL_OUT_OF_MEMORY, "out of memory");
        return;
    }
    /* The most urgent requests are prepared first. */
    actor_task_init(&t->t.base, prepare_run, (int)sj->priority);
    t->t.finish = prepare_finish;
    t->sj = sj;
    sj->phase = SJOB_PREPARING;
    sj->task = &t->t;
    sched_post(k, k->preparer, &t->t);
}
