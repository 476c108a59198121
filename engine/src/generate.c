/*
 * generate.c — the generation state machine (see generate.h).
 *
 * Text path of one step: token id -> streaming detokenizer (whole UTF-8 characters) -> stop
 * matcher (holds back a possible stop-string prefix) -> out->text, assembled in `emit` from the
 * matcher's held bytes followed by the releasable part of the new piece.
 *
 * A step is two halves around its forward pass: step_before (the checks, and the ends that need
 * no pass) and step_after (sampling and text). gen_next runs them around a model_forward of the
 * pending token; gen_step_batch runs the first halves of all its items, one model_forward_batch
 * for all their pending tokens and prompt slices, then the second halves, so that a generation
 * stepped in a batch goes through the very code it would alone.
 */
#include "corral/generate.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "corral/stop.h"
#include "corral/tokenizer.h"

struct generator {
    const model *m;
    const tokenizer *tok;
    model_runner *r;
    kv_cache *kv;
    sampler *smp;
    tok_decoder *dec;
    stop_matcher *stops;
    gen_params params;
    uint32_t n_vocab;
    float *logits; /* [n_vocab] prediction after the last token run */
    float *work;   /* [n_vocab] the sampler's scratch copy of logits */
    int have_logits;
    int32_t pending; /* sampled but not yet run through the model, or -1 */
    int started;     /* gen_next has been called */
    gen_stop stop;
    gen_logprob top[GEN_TOP_LOGPROBS_MAX]; /* the last token's alternatives (gen_token.top) */
    char *emit;                            /* text handed out by the last call */
    size_t emit_cap;
    gen_stats stats;
    /* gen_step_batch: the call that last took this generator (a number unique in the process, to
     * find a generator given twice), its item there, and what its step does next. */
    uint64_t batch_call;
    uint32_t batch_item;
    int batch_next;    /* a step_next */
    uint64_t batch_ns; /* the time of its step so far (decode_ns when the step succeeds) */
};

/* What a step does after step_before. */
typedef enum step_next {
    STEP_DONE = 0,   /* nothing: the step is over (out is filled) */
    STEP_SAMPLE = 1, /* sample from the logits gen_prefill left (step_after) */
    STEP_RUN = 2,    /* run the pending token through the model, then sample (step_after) */
} step_next;

const char *gen_stop_name(gen_stop stop) {
    switch (stop) {
        case GEN_STOP_NONE:
            return "running";
        case GEN_STOP_EOG:
            return "eog";
        case GEN_STOP_MAX_TOKENS:
            return "max_tokens";
        case GEN_STOP_STRING:
            return "stop_string";
        case GEN_STOP_CONTEXT:
            return "context_full";
        case GEN_STOP_CONSTRAINT:
            return "constraint";
    }
    return "?";
}

gen_params gen_params_default(void) {
    return (gen_params){.sampling = sampler_params_default()};
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

generator *gen_new(const model *m, model_runner *r, kv_cache *kv, const gen_params *params,
                   corral_error *err) {
    generator *g = calloc(1, sizeof *g);
    if (!g) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    g->m = m;
    g->tok = model_get_tokenizer(m);
    g->r = r;
    g->kv = kv;
    g->params = params ? *params : gen_params_default();
    g->params.stop = NULL; /* copied into the matcher; not kept */
    if (g->params.top_logprobs > GEN_TOP_LOGPROBS_MAX) {
        free(g);
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "top_logprobs must be at most %d",
                         GEN_TOP_LOGPROBS_MAX);
        return NULL;
    }
    g->n_vocab = model_get_hparams(m)->n_vocab;
    g->pending = -1;
    g->smp = sampler_new(&g->params.sampling, (int32_t)g->n_vocab, err);
    if (!g->smp) goto fail;
    if (g->params.processor) sampler_set_processor(g->smp, g->params.processor);
    g->dec = tok_decoder_new(g->tok, 0, err);
    if (!g->dec) goto fail;
    g->stops = stop_matcher_new(params ? params->stop : NULL, params ? params->n_stop : 0, err);
    if (!g->stops) goto fail;
    g->logits = malloc(g->n_vocab * sizeof(float));
    g->work = malloc(g->n_vocab * sizeof(float));
    /* One step emits at most the held stop prefix plus one decoded piece (and its held bytes). */
    g->emit_cap = STOP_MAX_LEN + tok_max_piece_len(g->tok) + 64;
    g->emit = malloc(g->emit_cap);
    if (!g->logits || !g->work || !g->emit) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    return g;
fail:
    gen_destroy(&g);
    return NULL;
}

void gen_destroy(generator **pg) {
    if (!pg || !*pg) return;
    generator *g = *pg;
    sampler_destroy(&g->smp);
    tok_decoder_destroy(&g->dec);
    stop_matcher_destroy(&g->stops);
    free(g->logits);
    free(g->work);
    free(g->emit);
    free(g);
    *pg = NULL;
}

/* What gen_prefill refuses before its pass. */
static corral_status prefill_check(const generator *g, corral_error *err) {
    if (g->started)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "prefill after generation has started");
    return CORRAL_OK;
}

/* After a prefill pass of n tokens that took ns. */
static void prefill_done(generator *g, uint32_t n, uint64_t ns, corral_status st) {
    g->stats.prefill_ns += ns;
    if (st != CORRAL_OK) return;
    g->stats.n_prompt += n;
    g->have_logits = 1;
}

corral_status gen_prefill(generator *g, const int32_t *ids, uint32_t n, corral_error *err) {
    corral_status st = prefill_check(g, err);
    if (st != CORRAL_OK || n == 0) return st;
    const uint64_t t0 = now_ns();
    st = model_forward(g->r, g->kv, ids, n, MODEL_LOGITS_LAST, g->logits, err);
    prefill_done(g, n, now_ns() - t0, st);
    return st;
}

/* Append bytes to the emit buffer (sized in gen_new so that one step always fits). */
static void emit_append(generator *g, size_t *len, const char *p, size_t n) {
    if (n > g->emit_cap - *len) n = g->emit_cap - *len; /* cannot happen; never overflow */
    memcpy(g->emit + *len, p, n);
    *len += n;
}

/* Pass decoded text through the stop matcher into the emit buffer. Returns 1 if a stop string
 * matched. */
static int emit_text(generator *g, size_t *len, const char *text, size_t n) {
    stop_result sr;
    stop_feed(g->stops, text, n, &sr);
    emit_append(g, len, sr.held, sr.held_len);
    emit_append(g, len, text, sr.piece_len);
    return sr.stopped;
}

/* End with `reason`: release the decoder's and the matcher's held bytes after what is already in
 * the emit buffer. */
static void finish_into(generator *g, gen_stop reason, size_t *len) {
    const char *text;
    size_t n;
    tok_decoder_flush(g->dec, &text, &n);
    int stopped = n ? emit_text(g, len, text, n) : 0;
    stop_result sr;
    stop_finish(g->stops, &sr);
    if (!stopped) emit_append(g, len, sr.held, sr.held_len);
    g->stop = stopped ? GEN_STOP_STRING : reason;
}

void gen_finish(generator *g, gen_stop reason, gen_token *out) {
    size_t len = 0;
    if (g->stop == GEN_STOP_NONE) finish_into(g, reason, &len);
    *out = (gen_token){.id = -1, .text = g->emit, .len = len, .stop = g->stop};
}

/* The first half of a step, up to its forward pass: the checks (errors as gen_next's), and the
 * ends that need no pass (a processor complete before any token, a full context), which fill
 * *out. Otherwise *next says what the step needs: the pending token run (STEP_RUN) or only
 * sampling (STEP_SAMPLE), then step_after. */
static corral_status step_before(generator *g, gen_token *out, step_next *next, corral_error *err) {
    if (g->stop != GEN_STOP_NONE)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION, "the generation has ended (%s)",
                                gen_stop_name(g->stop));
    if (!g->have_logits && g->pending < 0)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "nothing to continue from: prefill the prompt first");
    g->started = 1;
    *out = (gen_token){.id = -1, .text = g->emit};
    *next = STEP_DONE;
    /* A processor that is complete before any token (an output constraint matching only "")
     * ends the generation without a forward pass. */
    if (g->stats.n_generated == 0 && sampler_finished(g->smp) > 0) {
        finish_into(g, GEN_STOP_CONSTRAINT, &out->len);
    } else if (g->pending >= 0 && kv_cache_n_pos(g->kv) >= kv_cache_n_ctx(g->kv)) {
        finish_into(g, GEN_STOP_CONTEXT, &out->len);
    } else {
        *next = g->pending >= 0 ? STEP_RUN : STEP_SAMPLE;
    }
    out->stop = g->stop;
    return CORRAL_OK;
}

/* id's log-probability under the logits (log-softmax) and the k most likely tokens, best first:
 * one pass for the maximum, one for the sum and the top k (kept sorted by insertion, so
 * O(n_vocab) while few logits beat the k-th). No allocation. */
static void fill_logprobs(generator *g, int32_t id, gen_token *out) {
    const float *l = g->logits;
    const uint32_t n = g->n_vocab, k = g->params.top_logprobs;
    float max = l[0];
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > max) max = l[i];
    double sum = 0;
    uint32_t n_top = 0;
    for (uint32_t i = 0; i < n; i++) {
        sum += exp((double)(l[i] - max));
        if (k == 0 || (n_top == k && l[i] <= g->top[k - 1].logprob)) continue;
        uint32_t at = n_top < k ? n_top++ : k - 1;
        for (; at > 0 && g->top[at - 1].logprob < l[i]; at--) g->top[at] = g->top[at - 1];
        g->top[at] = (gen_logprob){.id = (int32_t)i, .logprob = l[i]};
    }
    const double lse = (double)max + log(sum);
    for (uint32_t i = 0; i < n_top; i++) g->top[i].logprob = (float)(g->top[i].logprob - lse);
    out->logprob = (float)(l[id] - lse);
    out->n_top = n_top;
    out->top = g->top;
}

/* The second half: the pending token has run (g->logits is the prediction after it), or there
 * was none. Sample, feed the processor and the text path, and decide whether the generation
 * ends; *out (from step_before) gets the token and the text. */
static corral_status step_after(generator *g, gen_token *out, corral_error *err) {
    g->pending = -1;
    memcpy(g->work, g->logits, g->n_vocab * sizeof(float));
    const int32_t id = sampler_sample(g->smp, g->work);
    if (id < 0) {
        if (id != CORRAL_FAILED_PRECONDITION)
            return corral_error_set(err, (corral_status)id, "sampling failed");
        const int fin = sampler_finished(g->smp);
        if (fin < 0)
            return corral_error_set(err, (corral_status)fin,
                                    "the output constraint cannot be completed: no token of the "
                                    "vocabulary continues it");
        finish_into(g, GEN_STOP_CONSTRAINT, &out->len);
        goto done;
    }
    corral_status acc = sampler_accept(g->smp, id);
    if (acc != CORRAL_OK)
        return corral_error_set(err, acc, "the logit processor refused token %d", (int)id);
    out->id = id;
    g->stats.n_generated++;
    if (g->params.logprobs) fill_logprobs(g, id, out);

    if (!g->params.ignore_eog && tok_is_eog(g->tok, id)) {
        finish_into(g, GEN_STOP_EOG, &out->len);
        goto done;
    }
    const char *text;
    size_t n;
    corral_status st = tok_decoder_feed(g->dec, id, &text, &n, err);
    if (st != CORRAL_OK) return st;
    if (emit_text(g, &out->len, text, n)) {
        g->stop = GEN_STOP_STRING;
        goto done;
    }
    if (sampler_finished(g->smp) > 0) {
        finish_into(g, GEN_STOP_CONSTRAINT, &out->len);
        goto done;
    }
    if (g->params.max_tokens && g->stats.n_generated >= g->params.max_tokens) {
        finish_into(g, GEN_STOP_MAX_TOKENS, &out->len);
        goto done;
    }
    g->pending = id;
done:
    out->stop = g->stop;
    return CORRAL_OK;
}

corral_status gen_next(generator *g, gen_token *out, corral_error *err) {
    const uint64_t t0 = now_ns();
    step_next next = STEP_DONE;
    corral_status st = step_before(g, out, &next, err);
    if (st != CORRAL_OK) return st;
    if (next == STEP_RUN) {
        st = model_forward(g->r, g->kv, &g->pending, 1, MODEL_LOGITS_LAST, g->logits, err);
        if (st != CORRAL_OK) return st;
    }
    if (next != STEP_DONE && (st = step_after(g, out, err)) != CORRAL_OK) return st;
    g->stats.decode_ns += now_ns() - t0;
    return CORRAL_OK;
}

/* ---- batched steps --------------------------------------------------------------------------- */

/* Tells one gen_step_batch call from every other (generator.batch_call). */
static _Atomic uint64_t batch_calls;

/* The call-wide checks: one model and runner, no generator twice. */
static corral_status batch_check(gen_batch_item *items, uint32_t n, corral_error *err) {
    if (!items) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "no items (NULL) for %u", n);
    const uint64_t call = atomic_fetch_add(&batch_calls, 1) + 1;
    for (uint32_t i = 0; i < n; i++) {
        generator *g = items[i].g;
        if (!g) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "item %u: no generator", i);
        if (g->m != items[0].g->m || g->r != items[0].g->r)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "item %u: its generator is over another model or runner than "
                                    "item 0's (a batch shares one)",
                                    i);
        if (g->batch_call == call)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "item %u: its generator is item %u's too", i, g->batch_item);
        g->batch_call = call;
        g->batch_item = i;
    }
    return CORRAL_OK;
}

/* The first half of an item's step; 1 when it needs the pass. */
static int batch_item_before(gen_batch_item *it) {
    generator *g = it->g;
    it->status = CORRAL_OK;
    it->err = (corral_error){.status = CORRAL_OK};
    it->token = (gen_token){.id = -1, .text = g->emit, .stop = g->stop};
    g->batch_next = STEP_DONE;
    if (!it->prefill) {
        step_next next = STEP_DONE;
        it->status = step_before(g, &it->token, &next, &it->err);
        g->batch_next = next;
        return it->status == CORRAL_OK && next == STEP_RUN;
    }
    it->status = prefill_check(g, &it->err);
    if (it->status != CORRAL_OK || it->n_prefill == 0) return 0;
    /* What model_forward_batch would refuse for this sequence alone fails the item alone, as
     * gen_prefill would, instead of the whole pass. */
    const uint32_t n_pos = kv_cache_n_pos(g->kv), n_ctx = kv_cache_n_ctx(g->kv);
    if ((uint64_t)n_pos + it->n_prefill > n_ctx) {
        it->status = corral_error_set(&it->err, CORRAL_RESOURCE_EXHAUSTED,
                                      "%u more tokens do not fit: context holds %u of %u positions",
                                      it->n_prefill, n_pos, n_ctx);
        return 0;
    }
    for (uint32_t i = 0; i < it->n_prefill; i++)
        if (it->prefill[i] < 0 || (uint32_t)it->prefill[i] >= g->n_vocab) {
            it->status = corral_error_set(&it->err, CORRAL_INVALID_ARGUMENT,
                                          "token id %d at index %u is outside the vocabulary (%u)",
                                          it->prefill[i], i, g->n_vocab);
            return 0;
        }
    g->batch_next = STEP_RUN;
    return 1;
}

/* The sequences of items[idx[0..n)] through one model_forward_batch; each item learns the
 * outcome (a failed pass fails them all). Returns the pass's status. */
static corral_status batch_pass(gen_batch_item *items, const uint32_t *idx, uint32_t n,
                                corral_error *err) {
    model_seq seqs[GEN_BATCH_PASS_SEQS];
    for (uint32_t k = 0; k < n; k++) {
        const gen_batch_item *it = &items[idx[k]];
        generator *g = it->g;
        /* A prompt slice, or the token the last step sampled. */
        seqs[k] = (model_seq){.kv = g->kv,
                              .tokens = it->prefill ? it->prefill : &g->pending,
                              .n_tokens = it->prefill ? it->n_prefill : 1,
                              .logits = g->logits};
    }
    const uint64_t t0 = now_ns();
    const corral_status st = model_forward_batch(items[idx[0]].g->r, seqs, n, err);
    const uint64_t ns = now_ns() - t0;
    for (uint32_t k = 0; k < n; k++) {
        gen_batch_item *it = &items[idx[k]];
        if (it->prefill)
            prefill_done(it->g, it->n_prefill, ns, st);
        else
            it->g->batch_ns += ns; /* the item waited for the whole pass */
        if (st != CORRAL_OK) {
            it->status = st;
            it->err = *err;
            it->g->batch_next = STEP_DONE;
        }
    }
    return st;
}

corral_status gen_step_batch(gen_batch_item *items, uint32_t n, corral_error *err) {
    if (n == 0) return CORRAL_OK;
    corral_error call_err;
    corral_status st = batch_check(items, n, &call_err);
    if (st != CORRAL_OK) {
        for (uint32_t i = 0; items && i < n; i++) {
            items[i].status = st;
            items[i].err = call_err;
            items[i].token = (gen_token){.id = -1};
        }
        if (err) *err = call_err;
        return st;
    }
    /* First halves; the items that need the pass, GEN_BATCH_PASS_SEQS at a time. */
    uint32_t idx[GEN_BATCH_PASS_SEQS], n_run = 0;
    corral_status pass = CORRAL_OK; /* the first failed pass's status and message */
    corral_error pass_err, first_err;
    for (uint32_t i = 0; i <= n; i++) {
        if (i < n) {
            const uint64_t t0 = now_ns();
            const int run = batch_item_before(&items[i]);
            items[i].g->batch_ns = now_ns() - t0;
            if (run) idx[n_run++] = i;
        }
        if (n_run == 0 || (n_run < GEN_BATCH_PASS_SEQS && i < n)) continue;
        st = batch_pass(items, idx, n_run, &pass_err);
        if (st != CORRAL_OK && pass == CORRAL_OK) {
            pass = st;
            first_err = pass_err;
        }
        n_run = 0;
    }
    /* Second halves, in item order. */
    for (uint32_t i = 0; i < n; i++) {
        gen_batch_item *it = &items[i];
        generator *g = it->g;
        if (it->prefill) continue;
        if (it->status == CORRAL_OK && g->batch_next != STEP_DONE) {
            const uint64_t t0 = now_ns();
            it->status = step_after(g, &it->token, &it->err);
            g->batch_ns += now_ns() - t0;
        }
        if (it->status == CORRAL_OK) g->stats.decode_ns += g->batch_ns;
    }
    if (pass != CORRAL_OK) {
        if (err) *err = first_err;
        return pass;
    }
    return CORRAL_OK;
}

const gen_stats *gen_get_stats(const generator *g) {
    return &g->stats;
}
