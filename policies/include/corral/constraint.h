/*
 * constraint.h — regex-constrained output: the whole generated text must match a pattern.
 *
 * Three objects:
 *   constraint_index    per tokenizer, built once: the bytes every token adds to the output
 *                       (tok_decode_piece without flags, exactly what the generator emits),
 *                       arranged as a byte trie in pre-order, and which tokens end a generation.
 *   constraint          a compiled pattern: a minimal DFA over bytes (see the syntax below) and,
 *                       per DFA state, the set of tokens allowed there, computed the first time
 *                       the state is met and kept (a bitset). Immutable apart from that cache,
 *                       which is filled under a lock, so one constraint serves any number of
 *                       generations on any threads. Reference-counted.
 *   constraint_matcher  one generation's position in the DFA. It plugs into the sampler as a
 *                       processor (constraint_matcher_processor): the sampler draws first and asks
 *                       `allowed` about the drawn token (one DFA walk over its bytes, or one bit
 *                       when the state's set is known); only when that fails is the state's set
 *                       needed, and `mask` applies it. `accept` advances the DFA; `finished` says
 *                       when the output is complete.
 * A constraint_cache keeps compiled constraints by pattern for one tokenizer (the daemon makes
 * one per loaded model). A constraint can also be compiled from a JSON Schema (json_schema.h
 * writes the pattern; CONSTRAINT_JSON_SCHEMA below).
 *
 * Allowed tokens. From DFA state s a token is allowed when its bytes lead from s to a state from
 * which an accepting state can still be reached (the DFA has no other states: the dead ones are
 * removed when it is built). Tokens that add no bytes (BOS, padding, unused ids) are never
 * allowed; end-of-generation tokens (tok_is_eog) are allowed exactly in accepting states. The set
 * for s comes from one walk of the vocabulary trie with the DFA in step: a trie node whose byte
 * kills the DFA is skipped with its whole subtree, so the walk costs the number of live prefixes,
 * not the vocabulary.
 *
 * Stopping. A state that accepts and has no transition (the pattern can match nothing longer)
 * makes the matcher `finished`: the generator ends with GEN_STOP_CONSTRAINT right after the token
 * that got there. If a state that does not accept has no allowed token (the vocabulary cannot
 * spell what the pattern needs next), `finished` reports CORRAL_FAILED_PRECONDITION and the
 * generation fails with an error. Stopping for any other reason (max_tokens, a stop string, the
 * context) can leave the output incomplete: only those outcomes are not guaranteed to match.
 *
 * Pattern syntax (ECMAScript-like; the whole output must match, as if wrapped in ^(?:...)$):
 * literals in UTF-8; `.` any character except \n \r U+2028 U+2029; classes `[...]` / `[^...]` with
 * ranges, `\uXXXX`, `\u{X...}` and non-ASCII members (`[\u4e00-\u9fa5，。！？]`); `\d \w \s` and
 * `\D \W \S` (ECMAScript's sets: ASCII digits and word characters, Unicode white space);
 * `\n \r \t \f \v \0 \cX \xHH`; escaped punctuation; groups `(...)`, `(?:...)`, `(?<name>...)`;
 * `|`; `* + ? {m} {m,} {m,n}` (m, n <= 1000; lazy `?` suffixes accepted); `^` and `$` at the very
 * start and end. Unsupported, each an error naming it: backreferences, lookahead, lookbehind,
 * `\b \B`, `\p{...}`, inline flags, anchors elsewhere. A pattern that matches nothing (`[]`,
 * `a[^\s\S]`) is an error. Matching is case-sensitive. Limits (a pattern cannot make the compile
 * run longer than some 50 ms or hold more than 32 MiB): 8192 bytes of pattern, counts up to 1000,
 * groups 128 deep, 200000 NFA states and 800000 edges once repetitions are expanded (checked
 * before a repetition is expanded), 10000 DFA states before minimisation, 20 million compile
 * steps (NFA states visited in closures, transitions computed, table cells), 32 MiB held by the
 * compile. Over one, CORRAL_RESOURCE_EXHAUSTED with a message naming it and, where one
 * construct is to blame, the construct and its offset ("regex: the pattern is too large: the
 * repetition {0,100} at offset 19 expands to 2030303 automaton states (limit
 * REGEX_MAX_NFA_STATES; ...)"). Compile time is linear in the length of a pattern without
 * repetitions (an 8 KiB literal: a few ms).
 *
 * Memory: a constraint reserves one bitset of n_vocab bits per DFA state as one zeroed block;
 * only the pages of states actually met are touched. Nothing is allocated per token.
 */
#ifndef CORRAL_CONSTRAINT_H
#define CORRAL_CONSTRAINT_H

#include <stddef.h>
#include <stdint.h>

#include "corral/sampler.h"
#include "corral/status.h"
#include "corral/tokenizer.h"

/* ---- per-tokenizer index --------------------------------------------------------------------- */

typedef struct constraint_index constraint_index;

/* Build the token-byte trie of t. t is borrowed and must outlive the index (and every constraint
 * made from it). Caller owns the result (constraint_index_destroy). Costs O(vocabulary log
 * vocabulary) time and about 20 bytes per trie node plus the token bytes. NULL and err filled on
 * failure (CORRAL_INVALID_ARGUMENT for NULL t, CORRAL_OUT_OF_MEMORY). Thread-safe. */
constraint_index *constraint_index_new(const tokenizer *t, corral_error *err);

/* Drop the caller's reference; the index is freed when constraints made from it are gone too.
 * NULL-safe; sets *ix to NULL. */
void constraint_index_destroy(constraint_index **ix);

/* Trie nodes (including the root) and the number of tokens in the trie (those that add bytes and
 * do not end the generation). */
uint32_t constraint_index_n_nodes(const constraint_index *ix);
uint32_t constraint_index_n_tokens(const constraint_index *ix);

/* ---- compiled patterns ----------------------------------------------------------------------- */

typedef struct constraint constraint;

/* What a constraint is compiled from. */
typedef enum constraint_syntax {
    CONSTRAINT_REGEX = 0,       /* a pattern, the syntax above */
    CONSTRAINT_JSON_SCHEMA = 1, /* a JSON Schema's text: json_schema.h turns it into a pattern
                                   (which may be longer than a hand-written one may be) */
    CONSTRAINT_SYNTAX_COUNT
} constraint_syntax;

/* Compile pattern[0..len) (UTF-8) for ix's vocabulary. Takes a reference on ix. Caller owns the
 * result (constraint_destroy). NULL and err filled on failure: CORRAL_INVALID_ARGUMENT for a
 * syntax error, an unsupported construct or a pattern that matches nothing, the message naming it
 * and its byte offset ("regex: lookahead (?=...) is not supported (at offset 3)");
 * CORRAL_RESOURCE_EXHAUSTED over a limit (see Limits above; the message names it);
 * CORRAL_OUT_OF_MEMORY. Bounded in time and memory whatever the pattern. Thread-safe. */
constraint *constraint_compile(constraint_index *ix, const char *pattern, size_t len,
                               corral_error *err);

/* constraint_compile for a source of either syntax: CONSTRAINT_REGEX as above; for
 * CONSTRAINT_JSON_SCHEMA the schema's errors (json_schema.h: "json schema: #/properties/age/
 * multipleOf: ..."), and a pattern the regex compiler finds too large is CORRAL_RESOURCE_EXHAUSTED
 * "json schema: the schema is too complex to compile: regex: ...". */
constraint *constraint_compile_as(constraint_index *ix, constraint_syntax syntax,
                                  const char *source, size_t len, corral_error *err);

/* Add a reference (for another owner). Returns c. Thread-safe. */
constraint *constraint_ref(constraint *c);

/* Drop the caller's reference; freed with the last one. NULL-safe; sets *c to NULL. */
void constraint_destroy(constraint **c);

/* The pattern compiled (NUL-terminated copy: the one given, or the one a JSON schema became), the
 * syntax of what it was compiled from, its DFA's state count, and how many states have their
 * allowed set computed so far. Borrowed / thread-safe. */
const char *constraint_pattern(const constraint *c);
constraint_syntax constraint_source_syntax(const constraint *c);
uint32_t constraint_n_states(const constraint *c);
uint32_t constraint_n_masks_built(const constraint *c);

/* 1 if the whole of text[0..len) matches the pattern (a DFA run; no tokens involved). */
int constraint_match(const constraint *c, const char *text, size_t len);

/* ---- cache by pattern ------------------------------------------------------------------------ */

typedef struct constraint_cache constraint_cache;

/* A cache of up to `capacity` compiled patterns (0 means 64) for tokenizer t (borrowed: it must
 * outlive the cache). The index is built on the first compile, not here. Caller owns the result
 * (constraint_cache_destroy). NULL and err filled on failure. */
constraint_cache *constraint_cache_new(const tokenizer *t, uint32_t capacity, corral_error *err);

/* Free the cache and its references. Constraints handed out stay valid until their owners destroy
 * them. NULL-safe; sets *cc to NULL. */
void constraint_cache_destroy(constraint_cache **cc);

/* The compiled constraint for pattern[0..len): from the cache, or compiled and kept (the least
 * recently used entry leaves when the cache is full). Caller owns the returned reference
 * (constraint_destroy). Errors as constraint_compile (failures are not cached). Thread-safe:
 * compilations are serialised by the cache's lock. */
constraint *constraint_compile_cached(constraint_cache *cc, const char *pattern, size_t len,
                                      corral_error *err);

/* constraint_compile_cached for a source of either syntax (constraint_compile_as); the cache
 * keys on syntax and source text. */
constraint *constraint_compile_cached_as(constraint_cache *cc, constraint_syntax syntax,
                                         const char *source, size_t len, corral_error *err);

/* Lookups that found the pattern, and compilations. */
void constraint_cache_stats(const constraint_cache *cc, uint64_t *hits, uint64_t *misses);

/* ---- one generation -------------------------------------------------------------------------- */

typedef struct constraint_matcher constraint_matcher;

/* A matcher at the start of c's DFA. Takes a reference on c. Caller owns the result
 * (constraint_matcher_destroy). One per generation, used by one thread at a time. */
constraint_matcher *constraint_matcher_new(constraint *c, corral_error *err);

/* NULL-safe; sets *m to NULL. */
void constraint_matcher_destroy(constraint_matcher **m);

/* Back to the start of the DFA (a new generation with the same pattern). */
void constraint_matcher_reset(constraint_matcher *m);

/* The sampler processor of m (allowed, mask, accept, finished; user = m). m must outlive every
 * sampler it is set on. */
sampler_processor constraint_matcher_processor(constraint_matcher *m);

/* The processor's callbacks, callable directly:
 *   allowed  — 1 if token may come next;
 *   mask     — set the logit of every token not allowed now to -INFINITY (tokens >= the
 *              vocabulary size included); the state's allowed set is computed on first use;
 *   accept   — advance over token: CORRAL_OK, or CORRAL_INVALID_ARGUMENT (state unchanged) for a
 *              token that is not allowed;
 *   finished — 1 when the output is complete (end-of-generation accepted, or an accepting state
 *              with no way on, or nothing allowed in an accepting state), 0 while more may come,
 *              CORRAL_FAILED_PRECONDITION when nothing is allowed and the output does not match.
 * No allocation. */
int constraint_matcher_allowed(const constraint_matcher *m, int32_t token);
void constraint_matcher_mask(constraint_matcher *m, float *logits, int32_t n_vocab);
corral_status constraint_matcher_accept(constraint_matcher *m, int32_t token);
int constraint_matcher_finished(const constraint_matcher *m);

/* 1 if the bytes accepted so far match the pattern in full. */
int constraint_matcher_is_accepting(const constraint_matcher *m);

#endif /* CORRAL_CONSTRAINT_H */
