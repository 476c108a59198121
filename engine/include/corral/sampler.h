/*
 * sampler.h — turning one row of logits into the next token.
 *
 * A sampler is a fixed chain, in llama.cpp's default order:
 *   1. penalties over the last `penalty_last_n` accepted tokens: repeat (a positive logit is
 *      divided by repeat_penalty, a zero or negative one multiplied by it), presence (subtracted
 *      once from every token seen) and frequency (subtracted count times);
 *   2. the logit processor's `apply` hook, if one is set;
 *   3. temperature <= 0: greedy argmax (ties go to the lowest token id) — nothing else runs;
 *      otherwise top-k (0 = off) → softmax → top-p (1 = off; the smallest prefix of the sorted
 *      tokens whose probability reaches top_p) → min-p (0 = off; tokens whose probability is at
 *      least min_p times the largest) → temperature → a draw from what is left.
 * top_k = 1 gives exactly the greedy token.
 *
 * Output constraints (a later issue compiles regexes to DFAs) plug in as a processor with an
 * `allowed`/`mask` pair: the sampler draws first and asks `allowed(token)`; only when the answer
 * is no does it call `mask` (which sets every disallowed logit to -INFINITY) and draw again from
 * the masked logits. Checking one token is cheap; computing a full mask is not, and most draws of
 * a well-behaved model are allowed anyway. For an allowed token the draw-first result has the
 * same probability as sampling from the masked distribution (p / P(allowed)), except that top-k,
 * top-p and min-p see the unmasked logits on the first draw — llama.cpp's grammar sampling has the
 * same property.
 *
 * Randomness: xoshiro256** seeded through splitmix64 from `seed`. The same parameters, seed, logits
 * and accepted tokens give the same tokens: the generator is exact integer arithmetic and the
 * probabilities are IEEE double in a fixed order, so results can differ between machines only
 * where their C libraries' exp() differ in the last bit and that moves a draw across a boundary.
 * sampler_reset restarts the generator from the seed.
 *
 * Odd logits: NaN is treated as -INFINITY (never chosen); +INFINITY as the largest finite float
 * (chosen before any finite logit, evenly among several). When every logit is -INFINITY/NaN (for
 * instance because a constraint masked all of them) sampler_sample returns an error, never a
 * token.
 *
 * Memory: sampler_new allocates everything; sampler_sample and sampler_accept never allocate.
 * A sampler is not thread-safe: use one per sequence, from one thread at a time.
 */
#ifndef CORRAL_SAMPLER_H
#define CORRAL_SAMPLER_H

#include <stdint.h>

#include "corral/status.h"

/* Upper bounds checked by sampler_validate_params and sampler_new (limits before allocation). */
#define SAMPLER_MAX_PENALTY_LAST_N 65536
#define SAMPLER_MAX_VOCAB          (1 << 24)

typedef struct sampler_params {
    float temperature;       /* >= 0; <= 0 means greedy */
    int32_t top_k;           /* >= 0; 0 = keep all */
    float top_p;             /* (0, 1]; 1 = keep all */
    float min_p;             /* [0, 1]; 0 = keep all */
    float repeat_penalty;    /* > 0; 1 = off */
    float presence_penalty;  /* any finite value; 0 = off */
    float frequency_penalty; /* any finite value; 0 = off */
    int32_t penalty_last_n;  /* window of accepted tokens the penalties look at; 0 = off */
    uint64_t seed; /* PRNG seed, used as is (the daemon picks one when a request has none) */
} sampler_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1,
 * presence and frequency 0, penalty_last_n 64; seed 0. Thread-safe. */
sampler_params sampler_params_default(void);

/* Check every field (NaN or infinity anywhere, negative temperature, top_k < 0, top_p outside
 * (0, 1], min_p outside [0, 1], repeat_penalty <= 0, penalty_last_n outside
 * [0, SAMPLER_MAX_PENALTY_LAST_N]). Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT with a message
 * naming the first bad field and its value ("top_p must be in (0, 1], got 1.5"). `err` may be
 * NULL. Thread-safe. */
corral_status sampler_validate_params(const sampler_params *params, corral_error *err);

typedef struct sampler sampler;

/* A logit processor. Every callback is optional (NULL); `user` is passed back unchanged.
 *   apply    — transform the logits in place on every step (after the penalties);
 *   allowed  — nonzero when `token` may be produced now; cheap, called on each drawn token;
 *   mask     — set the logit of every disallowed token to -INFINITY;
 *   accept   — the token was used (sampler_accept): advance the processor's own state (an output
 *              constraint's DFA). CORRAL_OK, or a negative status that sampler_accept returns
 *              (the token is then not recorded anywhere);
 *   finished — after the tokens accepted so far: 0 while more may follow, > 0 when the processor
 *              allows nothing more because the output is complete (the generator then ends with
 *              GEN_STOP_CONSTRAINT), or a negative corral_status when nothing is allowed and the
 *              output is not complete (the generator then fails with it).
 * With both `allowed` and `mask`, the sampler draws first and calls `mask` only when the drawn
 * token is not allowed, then draws again. They must agree: a token that survives the mask must be
 * allowed. With `mask` alone, the mask is applied on every step before drawing. With `allowed`
 * alone, a rejected draw makes the sampler build the mask itself by asking `allowed` about every
 * token (n_vocab calls). Callbacks must not call back into the sampler. */
typedef struct sampler_processor {
    void *user;
    void (*apply)(void *user, float *logits, int32_t n_vocab);
    int (*allowed)(void *user, int32_t token);
    void (*mask)(void *user, float *logits, int32_t n_vocab);
    corral_status (*accept)(void *user, int32_t token);
    int (*finished)(void *user);
} sampler_processor;

/* Create a sampler for a vocabulary of n_vocab tokens (1..SAMPLER_MAX_VOCAB). The params are
 * validated (as sampler_validate_params) and copied. Caller owns the result (sampler_destroy).
 * On failure returns NULL and fills err (CORRAL_INVALID_ARGUMENT, CORRAL_OUT_OF_MEMORY). */
sampler *sampler_new(const sampler_params *params, int32_t n_vocab, corral_error *err);

/* Free the sampler and set *s to NULL. NULL-safe (s or *s). */
void sampler_destroy(sampler **s);

/* Set the logit processor (copied; NULL removes it). The callbacks and `user` are borrowed: they
 * must stay valid while set. */
void sampler_set_processor(sampler *s, const sampler_processor *processor);

/* Choose the next token from `logits` (n_vocab floats, modified in place: on return they hold the
 * values after the penalties, the processor's apply and, if it ran, its mask). Does not record
 * the token: call sampler_accept with the token actually used. Returns a token id >= 0, or a
 * negative corral_status: CORRAL_FAILED_PRECONDITION when no token can be chosen (every logit
 * -INFINITY or NaN, after masking if a constraint ran), CORRAL_INTERNAL when a token that
 * survived the processor's mask is still not allowed by it, CORRAL_INVALID_ARGUMENT for NULL
 * arguments. Never allocates. */
int32_t sampler_sample(sampler *s, float *logits);

/* Record a token (generated, or from the prompt if the caller wants prompt tokens penalised) in
 * the penalty window, after passing it to the processor's `accept` (so record prompt tokens
 * before setting a processor that must see only generated ones). Returns CORRAL_OK,
 * CORRAL_INVALID_ARGUMENT for a token outside [0, n_vocab), or the processor's error (nothing
 * recorded then). Never allocates (unless the processor does). */
corral_status sampler_accept(sampler *s, int32_t token);

/* The processor's `finished` answer (see sampler_processor); 0 without a processor or callback. */
int sampler_finished(const sampler *s);

/* Forget the accepted tokens and restart the random generator from the seed: the sampler then
 * behaves exactly like a new one with the same params. The processor stays set (its own state is
 * its owner's to reset). */
void sampler_reset(sampler *s);

#endif /* CORRAL_SAMPLER_H */
