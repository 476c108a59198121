/*
 * generate.c — the generation state machine (see generate.h).
 *
 * Text path of one step: token id -> streaming detokenizer (whole UTF-8 characters) -> stop
 * matcher (holds back a possible stop-string prefix) -> out->text, assembled in `emit` from the
 * matcher's held bytes followed by the releasable part of the new piece.
 */
#include "corral/generate.h"

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
    char *emit; /* text handed out by the last call */
    size_t emit_cap;
    gen_stats stats;
};

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

corral_status gen_prefill(generator *g, const int32_t *ids, uint32_t n, corral_error *err) {
    if (g->started)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "prefill after generation has started");
    if (n == 0) return CORRAL_OK;
    const uint64_t t0 = now_ns();
    corral_status st = model_forward(g->r, g->kv, ids, n, MODEL_LOGITS_LAST, g->logits, err);
    g->stats.prefill_ns += now_ns() - t0;
    if (st != CORRAL_OK) return st;
    g->stats.n_prompt += n;
    g->have_logits = 1;
    return CORRAL_OK;
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

corral_status gen_next(generator *g, gen_token *out, corral_error *err) {
    if (g->stop != GEN_STOP_NONE)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION, "the generation has ended (%s)",
                                gen_stop_name(g->stop));
    if (!g->have_logits && g->pending < 0)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "nothing to continue from: prefill the prompt first");
    g->started = 1;
    const uint64_t t0 = now_ns();
    size_t len = 0;
    *out = (gen_token){.id = -1, .text = g->emit};

    /* A processor that is complete before any token (an output constraint matching only "")
     * ends the generation without a forward pass. */
    if (g->stats.n_generated == 0 && sampler_finished(g->smp) > 0) {
        finish_into(g, GEN_STOP_CONSTRAINT, &len);
        goto done;
    }
    if (g->pending >= 0) {
        if (kv_cache_n_pos(g->kv) >= kv_cache_n_ctx(g->kv)) {
            finish_into(g, GEN_STOP_CONTEXT, &len);
            goto done;
        }
        corral_status st =
            model_forward(g->r, g->kv, &g->pending, 1, MODEL_LOGITS_LAST, g->logits, err);
        if (st != CORRAL_OK) return st;
        g->pending = -1;
    }

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
        finish_into(g, GEN_STOP_CONSTRAINT, &len);
        goto done;
    }
    corral_status acc = sampler_accept(g->smp, id);
    if (acc != CORRAL_OK)
        return corral_error_set(err, acc, "the logit processor refused token %d", (int)id);
    out->id = id;
    g->stats.n_generated++;

    if (!g->params.ignore_eog && tok_is_eog(g->tok, id)) {
        finish_into(g, GEN_STOP_EOG, &len);
        goto done;
    }
    const char *text;
    size_t n;
    corral_status st = tok_decoder_feed(g->dec, id, &text, &n, err);
    if (st != CORRAL_OK) return st;
    if (emit_text(g, &len, text, n)) {
        g->stop = GEN_STOP_STRING;
        goto done;
    }
    if (sampler_finished(g->smp) > 0) {
        finish_into(g, GEN_STOP_CONSTRAINT, &len);
        goto done;
    }
    if (g->params.max_tokens && g->stats.n_generated >= g->params.max_tokens) {
        finish_into(g, GEN_STOP_MAX_TOKENS, &len);
        goto done;
    }
    g->pending = id;
done:
    g->stats.decode_ns += now_ns() - t0;
    out->len = len;
    out->stop = g->stop;
    return CORRAL_OK;
}

const gen_stats *gen_get_stats(const generator *g) {
    return &g->stats;
}
