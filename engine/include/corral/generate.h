/*
 * generate.h — one generation, step by step: prompt prefill, then one token per gen_next().
 *
 * A generator ties together a model, a runner (scratch), a KV cache (the sequence), a sampler, a
 * streaming detokenizer and a stop-string matcher. It is a state machine rather than a loop so
 * that the daemon's scheduler can interleave many generations at token boundaries: every call
 * does a bounded amount of work (one forward pass at most) and returns.
 *
 * The token sampled by gen_next is run through the model at the start of the *next* gen_next
 * (its logits are only needed then), so the last token of a finished generation costs nothing;
 * its position is not in the KV cache. Text is emitted only when it is certain: complete UTF-8
 * characters, and never a possible beginning of a stop string.
 *
 * Many generations over one model and runner can step together (gen_step_batch): their forward
 * passes become one batched pass (model_forward_batch), and each then samples on its own, with
 * the very results it would have had alone.
 */
#ifndef CORRAL_GENERATE_H
#define CORRAL_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "corral/model.h"
#include "corral/sampler.h"
#include "corral/status.h"

/* Why a generation ended. Append only: the protocol carries these numbers. */
typedef enum gen_stop {
    GEN_STOP_NONE = 0,       /* still running */
    GEN_STOP_EOG = 1,        /* the model produced an end-of-generation token */
    GEN_STOP_MAX_TOKENS = 2, /* max_tokens were generated */
    GEN_STOP_STRING = 3,     /* a stop string appeared (it is not part of the text) */
    GEN_STOP_CONTEXT = 4,    /* the KV cache's context is full */
    GEN_STOP_CONSTRAINT = 5, /* the logit processor allowed no token, or said it is finished */
} gen_stop;

/* "eog", "max_tokens", "stop_string", "context_full", "constraint", "running". */
const char *gen_stop_name(gen_stop stop);

typedef struct gen_params {
    sampler_params sampling;
    uint32_t max_tokens;     /* 0: until end-of-generation or a full context */
    const char *const *stop; /* stop strings (copied by gen_new) */
    size_t n_stop;
    int ignore_eog; /* keep going past end-of-generation tokens */
    /* Report each sampled token's log-probability under the model's distribution (the log-softmax
     * of its raw logits, before penalties, temperature and processors), and that of the
     * top_logprobs most likely tokens (at most GEN_TOP_LOGPROBS_MAX). Off by default: it costs a
     * pass over the vocabulary per token. */
    int logprobs;
    uint32_t top_logprobs;
    /* Optional; borrowed for the generator's life. Its `accept` sees every generated token
     * (including an end-of-generation one); when its `finished` turns positive after a token,
     * the generation ends there with GEN_STOP_CONSTRAINT (checked before max_tokens), and when a
     * draw finds nothing allowed, a negative `finished` makes gen_next fail with that status. */
    const sampler_processor *processor;
} gen_params;

/* Defaults: the sampler's defaults, no limit, no stop strings. */
gen_params gen_params_default(void);

/* The most alternatives gen_params.top_logprobs may ask for (OpenAI's limit). */
#define GEN_TOP_LOGPROBS_MAX 20

/* A token and its log-probability. */
typedef struct gen_logprob {
    int32_t id;
    float logprob;
} gen_logprob;

/* What one gen_next produced. */
typedef struct gen_token {
    int32_t id;       /* the token sampled this step; -1 when none was (context full, constraint) */
    const char *text; /* bytes that may be emitted now; borrowed until the next call */
    size_t len;
    gen_stop stop; /* GEN_STOP_NONE while running; otherwise the generation is over */
    /* With gen_params.logprobs and id >= 0: id's log-probability, and the n_top most likely
     * tokens, best first (borrowed until the next call). */
    float logprob;
    uint32_t n_top;
    const gen_logprob *top;
} gen_token;

/* Counters, for statistics and the protocol's Done message. */
typedef struct gen_stats {
    uint32_t n_prompt;    /* tokens prefilled through this generator */
    uint32_t n_generated; /* tokens sampled (an end-of-generation token counts) */
    uint64_t prefill_ns;  /* time in forward passes over the prompt */
    uint64_t decode_ns;   /* time in forward passes and sampling of generated tokens */
} gen_stats;

typedef struct generator generator;

/* A generator over (m, r, kv), which it borrows: they must outlive it, and kv is extended by it.
 * Validates the sampling parameters and stop strings. Caller owns the result (gen_destroy). */
generator *gen_new(const model *m, model_runner *r, kv_cache *kv, const gen_params *params,
                   corral_error *err);

/* NULL-safe; sets *g to NULL. */
void gen_destroy(generator **g);

/* Run prompt tokens through the model (appending them to the KV cache); may be called several
 * times with consecutive slices of a long prompt, before the first gen_next. Returns the
 * model_forward errors, or CORRAL_FAILED_PRECONDITION after gen_next has been called. */
corral_status gen_prefill(generator *g, const int32_t *ids, uint32_t n, corral_error *err);

/* Produce the next token. Before the first call at least one token must have been prefilled, or
 * the KV cache must already hold a sequence whose last logits were computed by gen_prefill.
 * Returns CORRAL_OK with *out filled (out->stop tells whether the generation is over; the final
 * call's text holds whatever was still held back), CORRAL_FAILED_PRECONDITION when called after
 * the end or before any prefill, a model error, or the processor's error (its `accept` refused
 * the token, or its `finished` reported that the output cannot be completed). */
corral_status gen_next(generator *g, gen_token *out, corral_error *err);

/* One generator's part of a batched step (gen_step_batch). */
typedef struct gen_batch_item {
    generator *g;
    const int32_t *prefill; /* prompt tokens for this step, as gen_prefill takes them; NULL: a
                               decode step, as gen_next */
    uint32_t n_prefill;
    /* Out. */
    corral_status status; /* CORRAL_OK, or the error gen_prefill / gen_next would have returned */
    gen_token token;      /* decode steps: what gen_next would have given */
    corral_error err;     /* the message when status is an error */
} gen_batch_item;

/* Most sequences gen_step_batch puts into one model_forward_batch call (the call's own stack holds
 * their descriptions). */
#define GEN_BATCH_PASS_SEQS 128

/* Step several generations at once: the prefill slices and the decode steps of all items run
 * through the model in one model_forward_batch (the weights read once for all of them), then
 * every decode item samples exactly as gen_next does (its own penalties, sampler, processor, stop
 * strings and text), in item order. Item by item the outcome is what gen_prefill (prefill set) or
 * gen_next (prefill NULL) called alone would give: the same logits bit for bit, the same token,
 * text, stop reason, error and counters; each item's prefill_ns / decode_ns count the whole shared
 * pass. A decode that needs no pass (the generation ended, the context is full, the processor
 * finished before any token, the first token after gen_prefill) is done without one. An item that
 * cannot run (a prefill that does not fit its context or holds a token outside the vocabulary, a
 * prefill after gen_next) fails alone, without the pass; so does one whose sampling fails (a
 * constraint that cannot be completed, a processor refusing the token). An empty prefill
 * (n_prefill 0) does nothing.
 *
 * Every generator must be over the same model and runner (those given to gen_new), and none may
 * appear twice: else CORRAL_INVALID_ARGUMENT, every item gets that status and nothing runs. Two
 * generators over one KV cache cannot share a pass: model_forward_batch refuses it, and that, like
 * any failure of the pass itself (weights released), fails every item that needed the pass, with
 * the pass's error, which is also returned; the other items keep their own results. Otherwise
 * returns CORRAL_OK: the items carry their own statuses. A step with more items needing the pass
 * than GEN_BATCH_PASS_SEQS runs one model_forward_batch per GEN_BATCH_PASS_SEQS of them, with the
 * same results. Nothing is allocated. Not thread-safe: the generators, their caches and the runner
 * must not be used by anyone else during the call. items is borrowed for the call; each
 * token.text until its generator's next call. */
corral_status gen_step_batch(gen_batch_item *items, uint32_t n, corral_error *err);

/* End the generation early (cancellation): releases held-back text into *out with
 * stop = reason. Further gen_next calls fail. */
void gen_finish(generator *g, gen_stop reason, gen_token *out);

const gen_stats *gen_get_stats(const generator *g);

#endif /* CORRAL_GENERATE_H */
