/*
 * batch.c — starting prepared jobs and stepping a model's active jobs together.
 *
 * A step takes, for one model, every active job whose client is reading (at most the batch's
 * capacity: limits.active_per_model plus SCHED_MAX_REALTIME_EXTRA realtime ones), highest class
 * first, then the one that waited longest since its last step. Each job that has its prompt in
 * the cache contributes its next token; the prompt tokens of jobs still prefilling share a budget
 * of limits.prefill_chunk tokens per step, so that a long prompt cannot make a step long — and
 * only jobs of the step's highest class prefill, so that a background prompt never slows a
 * realtime or interactive one. The step's tokens then go through the model together.
 *
 * The engine calls of a step read the model's mapped files (weights, and the tokenizer's strings
 * while detokenizing). A read that faults (the file was truncated under us) is caught: inside the
 * forward pass by the engine, which fails the pass; anywhere else in the engine's part of the
 * step by the guard here (fault.h). Either way the model is broken (residency_break) and its
 * requests end with an Error naming the file; the other models are untouched.
 */
#include <stdlib.h>
#include <string.h>

#include "corral/fault.h"
#include "corral/log.h"
#include "corral/tokenizer.h"
#include "sched_impl.h"

corral_status batch_alloc(struct core *k, sched_model *sm, corral_error *err) {
    const uint32_t cap = (uint32_t)core_cfg(k)->active_per_model + SCHED_MAX_REALTIME_EXTRA;
    if (sm->members && sm->batch_cap >= cap) return CORRAL_OK;
    const unsigned scope = mem_scope_enter(sm->owner);
    sjob **members = realloc(sm->members, cap * sizeof *members);
    if (members) sm->members = members;
    gen_batch_item *items = realloc(sm->items, cap * sizeof *items);
    if (items) sm->items = items;
    mem_scope_leave(scope);
    if (!members || !items) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    sm->batch_cap = cap;
    return CORRAL_OK;
}

void batch_free(sched_model *sm) {
    free(sm->members);
    free(sm->items);
    sm->members = NULL;
    sm->items = NULL;
    sm->batch_cap = 0;
}

/* ---- starting -------------------------------------------------------------------------------- */

/* Undo what a start that failed or must wait had made: the job either fails or tries again from
 * its prepared state. */
static void start_undo(sjob *sj) {
    if (sj->kv && !sj->session) residency_kv_free(sj->model, &sj->kv);
    sj->kv = NULL;
    if (sj->session && sj->session->busy == sj) sj->session->busy = NULL;
    sj->session = NULL;
    sj->n_cached = sj->n_prefilled = 0;
}

corral_status batch_start(struct core *k, sjob *sj, bool *wait, corral_error *err) {
    sched_model *sm = sj->model;
    *wait = false;
    corral_status st = CORRAL_OK;
    if (sj->j->req.generate.session[0]) st = session_attach(k, sj, err);
    sched_session *ss = sj->session;
    if (st == CORRAL_OK && (!ss || !ss->kv)) {
        /* A new cache: the session's whole context, or just enough for this request. */
        uint32_t positions = sm->context;
        if (!ss && sj->n_prompt + sj->max_tokens < positions)
            positions = sj->n_prompt + sj->max_tokens;
        switch (residency_make_room(k, residency_kv_bytes(sm, positions), sm, err)) {
            case BUDGET_FITS: {
                kv_cache *kv = residency_kv_new(sm, positions, err);
                if (!kv)
                    st = err->status;
                else if (ss)
                    ss->kv = kv;
                else
                    sj->kv = kv;
                break;
            }
            case BUDGET_WAIT:
                /* Room comes when the writes in flight are done: try again then. */
                corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                 "waiting for session caches to be written out");
                st = CORRAL_RESOURCE_EXHAUSTED;
                *wait = true;
                break;
            case BUDGET_FULL:
                st = CORRAL_RESOURCE_EXHAUSTED;
                *wait = true;
                break;
            case BUDGET_NEVER:
                corral_error_prefix(err, "model '%s': a KV cache of %u positions", sm->name,
                                    positions);
                sj->j->error_rule = JOB_RULE_MEMORY_LIMIT;
                st = CORRAL_RESOURCE_EXHAUSTED;
                break;
        }
    }
    if (st != CORRAL_OK) {
        start_undo(sj);
        return st;
    }
    if (ss) {
        ss->busy = sj;
        sj->kv = ss->kv;
        if (ss->swapped) {
            /* Its positions are on disk: read them back first (io actor). */
            session_start_swap_in(k, ss, sj);
            return CORRAL_OK;
        }
    }
    batch_finish_start(k, sj);
    return CORRAL_OK;
}

void batch_finish_start(struct core *k, sjob *sj) {
    sched_model *sm = sj->model;
    sched_session *ss = sj->session;
    if (ss) {
        /* Reuse the longest prefix the cache already holds; the last prompt token always runs
         * again so that its logits are fresh. */
        uint32_t common = 0;
        while (common < ss->n_tokens && common < sj->n_prompt &&
               ss->tokens[common] == sj->prompt[common])
            common++;
        if (common >= sj->n_prompt) common = sj->n_prompt - 1;
        /* A sliding-window cache cut back further than its slack empties instead. */
        common = kv_cache_truncate(ss->kv, common);
        ss->n_tokens = common;
        sj->n_cached = common;
        sj->n_prefilled = common;
    }
    corral_error err;
    /* The generation's state (sampler, penalties, stop matcher) is the request's, like its
     * prompt and constraint (prepare.c): outside the model's arena, whose bytes the memory
     * budget plans (the KV cache above is planned there). */
    const unsigned scope = mem_scope_default();
    sj->g = gen_new(sm->m, sm->runner, sj->kv, &sj->params, &err);
    mem_scope_leave(scope);
    if (!sj->g) {
        sched_finish_error(k, sj, err.status, "%s", err.message);
        return;
    }
    sj->phase = SJOB_ACTIVE;
    sj->started_us = sched__mono_us();
    sm->last_used_ms = sched__unix_ms();
}

/* ---- stepping -------------------------------------------------------------------------------- */

/* A job's result of the step: a prefill slice ran, or a token came out. */
static void after_prefill(struct core *k, sjob *sj, uint32_t n, int64_t us) {
    sj->prefill_us += us;
    sj->n_prefilled += n;
    /* Long prompts report progress so the client sees the request is alive. */
    if (sj->n_prompt - sj->n_cached > (uint32_t)core_cfg(k)->prefill_chunk)
        job_emit_progress(sj->j, JOB_PHASE_PREFILL, sj->n_prefilled, sj->n_prompt);
}

static void after_token(struct core *k, sjob *sj, const gen_token *t, int64_t us) {
    sj->decode_us += us;
    if (t->id >= 0 && sj->n_generated < sj->cap_generated) sj->generated[sj->n_generated++] = t->id;
    if (t->id >= 0 && sj->params.logprobs) {
        /* The token and its alternatives with their texts, for the client's logprobs. */
        job_logprob lps[1 + GEN_TOP_LOGPROBS_MAX];
        const char *texts[1 + GEN_TOP_LOGPROBS_MAX];
        char bytes[1 + GEN_TOP_LOGPROBS_MAX][64];
        const tokenizer *tok = model_get_tokenizer(sj->model->m);
        const uint32_t n = 1 + t->n_top;
        for (uint32_t i = 0; i < n; i++) {
            lps[i].id = i == 0 ? t->id : t->top[i - 1].id;
            lps[i].logprob = i == 0 ? t->logprob : t->top[i - 1].logprob;
            size_t got = 0;
            corral_error err;
            /* A piece longer than 64 bytes (none in real vocabularies) goes without its text. */
            if (tok_decode_piece(tok, lps[i].id, 0, bytes[i], sizeof bytes[i], &got, &err) !=
                CORRAL_OK)
                got = 0;
            lps[i].text_len = (uint32_t)got;
            texts[i] = bytes[i];
        }
        job_emit_token(sj->j, t->text, t->len, t->id, lps, texts, n);
    } else if (t->len > 0 || t->id >= 0) {
        job_emit_text(sj->j, t->text, t->len, t->id);
    }
    if (t->stop != GEN_STOP_NONE) sched_finish_done(k, sj, (core_stop)t->stop);
}

/* The engine's part of a step, under a fault guard: gen_step_batch (one = NULL), or gen_next for
 * one generator. A fault that escapes the engine (outside its forward pass) leaves the generators
 * it was in half-stepped: the caller breaks the model, which ends them all. */
static corral_status engine_guarded(sched_model *sm, gen_batch_item *items, uint32_t n,
                                    generator *one, gen_token *token, corral_error *err,
                                    bool *faulted) {
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        const corral_status st = one ? gen_next(one, token, err) : gen_step_batch(items, n, err);
        fault_guard_leave(&g);
        return st;
    }
    *faulted = true;
    return model_note_fault(sm->m, &g.info, err);
}

/* Whether sj goes before other in a step: higher class, then the longer wait since its last
 * step. */
static bool goes_first(const sjob *sj, const sjob *other) {
    if (sj->priority != other->priority) return sj->priority > other->priority;
    return sj->last_step_us < other->last_step_us;
}

void batch_step(struct core *k, sched_model *sm) {
    /* The members, best first: an insertion sort that keeps the batch_cap best. */
    uint32_t n = 0;
    for (sjob *sj = k->jobs; sj; sj = sj->next) {
        if (sj->model != sm || sj->phase != SJOB_ACTIVE || atomic_load(&sj->j->paused)) continue;
        uint32_t i;
        if (n < sm->batch_cap)
            i = n++;
        else if (goes_first(sj, sm->members[n - 1]))
            i = n - 1;
        else
            continue;
        sm->members[i] = sj;
        for (; i > 0 && goes_first(sm->members[i], sm->members[i - 1]); i--) {
            sjob *t = sm->members[i];
            sm->members[i] = sm->members[i - 1];
            sm->members[i - 1] = t;
        }
    }
    if (n == 0) return;
    const cfg *c = core_cfg(k);
    const cfg_priority top = sm->members[0]->priority;
    uint32_t prefill_budget = (uint32_t)c->prefill_chunk;
    const int64_t now = sched__mono_us();
    sm->last_step_us = now;
    sm->last_used_ms = sched__unix_ms();
    /* The step's items: every decoding member's next token, and prefill slices within the
     * budget for members of the top class. Members left out wait for a later step. */
    uint32_t n_items = 0;
    for (uint32_t i = 0; i < n; i++) {
        sjob *sj = sm->members[i];
        gen_batch_item *it = &sm->items[n_items];
        if (sj->n_prefilled < sj->n_prompt) {
            if (sj->priority != top || prefill_budget == 0) continue;
            uint32_t take = sj->n_prompt - sj->n_prefilled;
            if (take > prefill_budget) take = prefill_budget;
            prefill_budget -= take;
            *it = (gen_batch_item){
                .g = sj->g, .prefill = sj->prompt + sj->n_prefilled, .n_prefill = take};
        } else {
            *it = (gen_batch_item){.g = sj->g};
        }
        sj->last_step_us = now;
        sm->members[n_items++] = sj;
    }
    if (n_items == 0) return;
    for (uint32_t i = 0; i < n_items; i++)
        if (!sm->members[i]->stepped) {
            sm->members[i]->stepped = true;
            sm->members[i]->queue_steps = (uint32_t)(k->steps - sm->members[i]->steps_at_receipt);
        }
    k->steps++;
    sm->steps++;
    sm->step_sequences += n_items;
    /* One forward pass for all of them. The pass allocates nothing of the model's (its scratch
     * was sized at load); what a step may allocate is the requests' own (an output constraint
     * computes a DFA state's allowed tokens on first use), so it goes to the default arena: in
     * the model's it grew the model's bytes past what the memory budget had planned. */
    const unsigned scope = mem_scope_default();
    corral_error err;
    bool faulted = false;
    engine_guarded(sm, sm->items, n_items, NULL, NULL, &err, &faulted);
    const int64_t us = sched__mono_us() - now;
    if (faulted) {
        /* Every member is half-stepped: the break ends them all (reap). */
        mem_scope_leave(scope);
        residency_break(k, sm, err.message);
        return;
    }
    for (uint32_t i = 0; i < n_items && !faulted; i++) {
        sjob *sj = sm->members[i];
        gen_batch_item *it = &sm->items[i];
        if (it->status != CORRAL_OK) {
            sched_finish_error(k, sj, it->err.status, "%s", it->err.message);
            continue;
        }
        if (it->prefill) {
            after_prefill(k, sj, it->n_prefill, us);
            /* A prompt read to its end has its first token's logits: that token comes out in
             * this step (sampling only, no forward pass). */
            if (sj->n_prefilled < sj->n_prompt) continue;
            const int64_t t0 = sched__mono_us();
            if (engine_guarded(sm, NULL, 0, sj->g, &it->token, &it->err, &faulted) != CORRAL_OK) {
                sched_finish_error(k, sj, it->err.status, "%s", it->err.message);
                continue;
            }
            after_token(k, sj, &it->token, sched__mono_us() - t0);
            continue;
        }
        after_token(k, sj, &it->token, us);
    }
    mem_scope_leave(scope);
    /* A fault in the pass (the engine failed the items that needed it) or after it. */
    const char *fault = model_fault(sm->m);
    if (fault) residency_break(k, sm, fault);
}
