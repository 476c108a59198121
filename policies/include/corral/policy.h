/*
 * policy.h — policies: what may go into a model and what may come out, behind one versioned C ABI.
 *
 * A policy is a table of callbacks, `corral_policy_v1`: a name, `init` from a list of key/value
 * strings (the config node, flattened), optional `sanitize` (look at — and possibly rewrite or
 * refuse — the text a client sent), optional generation hooks (`gen_*`: restrict which tokens may
 * come out, like a sampler processor), and `destroy`. The built-in sanitizers (utf8, invisible,
 * special_tokens, max_input, deny, normalize_space: sanitize.h) and the built-in output
 * constraint (`regex`) are policies like any other; external ones are shared libraries loaded
 * with dlopen that export `corral_policy_v1_entry`.
 *
 * This header has two parts:
 *   1. the ABI, self-contained (stddef.h and stdint.h only). A plugin defines
 *      CORRAL_POLICY_ABI_ONLY before including this file and needs nothing else from corral;
 *   2. the host side corrald uses: loading plugins, profiles (ordered policies built from config
 *      values), the per-model vocabulary services, running a profile's sanitizers over a request,
 *      and one sampler processor per generation.
 *
 * ABI rules (version 1). Append only: new callbacks go at the end of the struct and a plugin
 * reports its struct_size, so a newer corral can load an older plugin (missing callbacks count as
 * NULL). A different abi_version is refused at load. Strings passed to callbacks are borrowed for
 * the call; a callback never frees what it did not allocate. `init` and `destroy` run on one
 * thread; `sanitize` may run on several threads at once over the same instance (it must not
 * modify the instance without its own locking); gen_* calls for one generation come from one
 * thread at a time. Status values are corral's (base/include/corral/status.h): 0 is success,
 * negative values are errors; the ones a plugin typically returns are repeated below.
 */
#ifndef CORRAL_POLICY_ABI_
#define CORRAL_POLICY_ABI_

#include <stddef.h>
#include <stdint.h>

#define CORRAL_POLICY_ABI_VERSION  1u
#define CORRAL_POLICY_ENTRY_SYMBOL "corral_policy_v1_entry"

/* Status values for plugins (the same numbers as corral_status). */
#define CORRAL_POLICY_OK               0
#define CORRAL_POLICY_INVALID_ARGUMENT (-1) /* bad configuration */
#define CORRAL_POLICY_OUT_OF_MEMORY    (-6)
#define CORRAL_POLICY_TOO_LARGE        (-7)  /* RESOURCE_EXHAUSTED: out->write past the limit */
#define CORRAL_POLICY_REJECTED         (-11) /* SANITIZER_REJECTED: refuse this input */
#define CORRAL_POLICY_INTERNAL         (-12) /* the policy failed: this request fails */

/* What a sanitize callback did with the text (non-negative returns). */
#define CORRAL_POLICY_KEEP    0 /* nothing to change (nothing was written) */
#define CORRAL_POLICY_REWRITE 1 /* replace the text with what was written through out->write */
#define CORRAL_POLICY_FLAG    2 /* unchanged, but the report should show what was noticed */

/* One configuration value: both strings NUL-terminated, borrowed for the call. */
typedef struct corral_policy_kv {
    const char *key;
    const char *value;
} corral_policy_kv;

/* Token kinds (corral_policy_host.token_kind). */
#define CORRAL_POLICY_TOKEN_NORMAL  0 /* text */
#define CORRAL_POLICY_TOKEN_CONTROL 1 /* control / unknown: never produced from user text */
#define CORRAL_POLICY_TOKEN_EOG     2 /* ends a generation */
#define CORRAL_POLICY_TOKEN_EMPTY   3 /* renders as nothing (unused, padding) */

/* Services of the model a request is for. Every function is thread-safe; results borrowed from
 * the host stay valid until the policy's callback returns (gen_*: until gen_end). */
typedef struct corral_policy_host {
    uint32_t struct_size; /* sizeof(corral_policy_host) of the host */
    void *ctx;            /* pass back to the functions below */
    int32_t n_vocab;
    /* Tokens text[0..len) becomes for the model as user text (special tokens never parsed),
     * without BOS/EOS; negative status on failure. */
    int64_t (*count_tokens)(void *ctx, const char *text, size_t len);
    /* The bytes token id adds to the output (the empty string for control tokens); 0, or
     * CORRAL_POLICY_INVALID_ARGUMENT for an id out of range. */
    int (*token_bytes)(void *ctx, int32_t id, const char **bytes, size_t *len);
    /* CORRAL_POLICY_TOKEN_*; -1 for an id out of range. */
    int (*token_kind)(void *ctx, int32_t id);
    /* The length of the longest special-token text (a control token's, or a user-defined marker
     * such as "<|User|>") that text[0..len) starts with; 0 when none does. */
    size_t (*special_prefix)(void *ctx, const char *text, size_t len);
} corral_policy_host;

/* Where sanitize writes: out->write(out, bytes, n) appends to the new text (0, or a negative
 * status — the text grew past the host's limit, or memory ran out — which the callback should
 * return). `count` and `note` feed the step's report line: how many things the step acted on,
 * and what it did or, for a rejection, why ("contains the word 'forbidden'"). */
typedef struct corral_policy_out {
    int (*write)(struct corral_policy_out *out, const char *bytes, size_t len);
    void *host_data; /* the host's; do not touch */
    uint32_t count;
    char note[160];
} corral_policy_out;

typedef struct corral_policy_v1 {
    uint32_t abi_version; /* CORRAL_POLICY_ABI_VERSION */
    uint32_t struct_size; /* sizeof(corral_policy_v1) as the plugin was built */
    const char *name;     /* short, [a-z0-9_.-]; shown in reports and errors */
    const char *description;

    /* Parse config[0..n_config) into a new instance (*instance; may stay NULL for a policy
     * without state). Return 0, or a negative status with a message in msg (msg_cap bytes,
     * NUL-terminated) naming the key at fault. Required. */
    int (*init)(const corral_policy_kv *config, size_t n_config, void **instance, char *msg,
                size_t msg_cap);
    /* Free an instance. NULL when init allocates nothing. */
    void (*destroy)(void *instance);

    /* Look at one piece of user text (a prompt, or one chat message's content). Return
     * CORRAL_POLICY_KEEP, CORRAL_POLICY_REWRITE (after writing the whole new text through
     * out->write), CORRAL_POLICY_FLAG, CORRAL_POLICY_REJECTED (out->note says why: the request
     * fails with SANITIZER_REJECTED naming this policy), or another negative status (the request
     * fails with it). NULL: the policy does not sanitize. */
    int (*sanitize)(void *instance, const corral_policy_host *host, const char *text, size_t len,
                    corral_policy_out *out);

    /* Generation hooks: all NULL, or gen_begin plus any of the others; gen_allowed and gen_mask
     * come together (draw first, mask only when the drawn token is not allowed; they must
     * agree), exactly as in the engine's sampler_processor.
     *   gen_begin    — a new generation under host's model: *gen is its state. 0 or negative.
     *   gen_allowed  — nonzero if token may come next.
     *   gen_mask     — set the logit of every token not allowed now to -INFINITY.
     *   gen_accept   — token was produced: advance. 0, or negative (the request fails).
     *   gen_finished — 0 while more may come; > 0 when the output is complete (the generation
     *                  stops); negative when nothing is allowed and the output is incomplete.
     *   gen_end      — the generation is over: free *gen. */
    int (*gen_begin)(void *instance, const corral_policy_host *host, void **gen);
    int (*gen_allowed)(void *gen, int32_t token);
    void (*gen_mask)(void *gen, float *logits, int32_t n_vocab);
    int (*gen_accept)(void *gen, int32_t token);
    int (*gen_finished)(void *gen);
    void (*gen_end)(void *gen);
} corral_policy_v1;

/* The symbol a plugin exports: returns its table (static storage; never NULL). */
typedef const corral_policy_v1 *(*corral_policy_v1_entry_fn)(void);

#endif /* CORRAL_POLICY_ABI_ */

#if !defined(CORRAL_POLICY_ABI_ONLY) && !defined(CORRAL_POLICY_HOST_)
#define CORRAL_POLICY_HOST_

#include "corral/constraint.h"
#include "corral/sampler.h"
#include "corral/sanitize.h"
#include "corral/status.h"
#include "corral/tokenizer.h"

/* ---- definitions: built-in or loaded ----------------------------------------------------------
 */

/* The built-in policy called name ("utf8", "invisible", "special_tokens", "max_input", "deny",
 * "normalize_space", "regex"), or NULL. Static; thread-safe. */
const corral_policy_v1 *policy_builtin_find(const char *name);

/* "utf8, invisible, special_tokens, max_input, deny, normalize_space, regex". Static. */
const char *policy_builtin_names(void);

typedef struct policy_plugin policy_plugin;

/* dlopen the shared library at path and check its table: the entry symbol exists, abi_version is
 * CORRAL_POLICY_ABI_VERSION, struct_size covers version 1's callbacks, name is set, init exists,
 * the generation hooks come as the ABI says. Caller owns the result (policy_plugin_destroy).
 * NULL and err filled on failure, the message naming the path and, for loader errors, dlerror()'s
 * text: CORRAL_IO (dlopen failed), CORRAL_NOT_FOUND (no entry symbol), CORRAL_UNSUPPORTED (another
 * ABI version), CORRAL_FORMAT (a malformed table). */
policy_plugin *policy_plugin_load(const char *path, corral_error *err);

/* The plugin's table; borrowed until policy_plugin_destroy. */
const corral_policy_v1 *policy_plugin_table(const policy_plugin *p);

/* dlclose. Every instance made from the plugin must be destroyed first. NULL-safe; sets *p to
 * NULL. */
void policy_plugin_destroy(policy_plugin **p);

/* ---- per-model services ------------------------------------------------------------------------
 */

typedef struct policy_vocab policy_vocab;

/* The host services (corral_policy_host) for tokenizer t, the special-token texts its user text
 * must not smuggle (control and unknown tokens, and user-defined ones that look like markers:
 * <...> or [...]), and a cache of compiled output constraints. t is borrowed: it must outlive the
 * result. Caller owns the result (policy_vocab_destroy): the daemon makes one per loaded model.
 * NULL and err filled on failure. Thread-safe to use from many threads after creation. */
policy_vocab *policy_vocab_new(const tokenizer *t, corral_error *err);

/* NULL-safe; sets *v to NULL. Generations using it must have ended. */
void policy_vocab_destroy(policy_vocab **v);

/* Borrowed; valid until policy_vocab_destroy. */
const corral_policy_host *policy_vocab_host(const policy_vocab *v);
constraint_cache *policy_vocab_constraints(policy_vocab *v);

/* The special-token texts found, in the order of the vocabulary: *n of them, each NUL-terminated
 * (borrowed). */
const char *const *policy_vocab_specials(const policy_vocab *v, size_t *n);

/* ---- profiles ----------------------------------------------------------------------------------
 */

/* One step of a profile, as the config describes it. kind: a built-in name, or "plugin" with
 * path set to the shared library; params: the step's settings as strings (borrowed for the
 * call). The built-ins' keys:
 *   utf8             mode: reject | repair                          (default reject)
 *   invisible        (none)
 *   special_tokens   mode: keep | strip                             (default keep)
 *   max_input        bytes: N, tokens: N (0 = no limit; K/KiB/M/MiB suffixes; at least one)
 *   deny             NAME: REGEX, one pair per rule (REGEX searched anywhere in the text; write
 *                    it as /REGEX/i for ASCII-caseless); at least one
 *   normalize_space  trim: true|false (true), collapse: true|false (true),
 *                    max_newlines: N (2; 0 = keep every newline)
 *   regex            pattern: REGEX (every output under this profile must match it) */
typedef struct policy_step_desc {
    const char *kind;
    const char *path;
    const corral_policy_kv *params;
    size_t n_params;
} policy_step_desc;

#define POLICY_MAX_STEPS SANITIZE_MAX_STEPS

typedef struct policy_profile policy_profile;

/* A profile called name (copied) with steps[0..n_steps) in that order (at most
 * POLICY_MAX_STEPS). Plugins are loaded and every step's init runs now, so a bad path or setting
 * fails here — at startup — with a message naming the profile, the step and the problem
 * ("profile 'strict', step 3 (plugin /x.so): cannot load: ..."). Caller owns the result
 * (policy_profile_destroy). Not thread-safe while being built; afterwards read-only. */
policy_profile *policy_profile_new(const char *name, const policy_step_desc *steps, size_t n_steps,
                                   corral_error *err);

/* Destroy instances, then unload plugins. NULL-safe; sets *p to NULL. */
void policy_profile_destroy(policy_profile **p);

const char *policy_profile_name(const policy_profile *p);
size_t policy_profile_n_steps(const policy_profile *p);

/* The name of step i ("utf8", or a plugin's own name); NULL out of range. */
const char *policy_profile_step_name(const policy_profile *p, size_t i);

/* Run the profile's sanitizers, in order, over text[0..len) for the model of v. On success
 * *out (malloc'ed, NUL-terminated; caller frees) and *out_len hold the text to tokenize — a copy
 * even when nothing changed. *report (may be NULL) gets one line per sanitizing step. Errors:
 * CORRAL_SANITIZER_REJECTED with err naming the step and its reason ("sanitizer 'deny' rejected
 * the input: matches 'jailbreak'"), a plugin's own negative status ("sanitizer 'x' failed: ..."),
 * CORRAL_RESOURCE_EXHAUSTED when a step's output grows past 8 x input + 1 MiB,
 * CORRAL_OUT_OF_MEMORY; *out is NULL then. p may be NULL (no steps: a plain copy). Thread-safe. */
corral_status policy_sanitize(const policy_profile *p, const policy_vocab *v, const char *text,
                              size_t len, char **out, size_t *out_len, sanitize_report *report,
                              corral_error *err);

/* ---- one generation ----------------------------------------------------------------------------
 */

typedef struct policy_gen policy_gen;

/* The output restrictions of one generation: the request's regex (regex may be NULL or empty for
 * none; compiled through v's cache) and the generation hooks of p's steps (p may be NULL). Caller
 * owns the result (policy_gen_destroy); it must outlive the generator it is set on. Errors:
 * CORRAL_INVALID_ARGUMENT / CORRAL_RESOURCE_EXHAUSTED for a bad regex (constraint.h), a plugin's
 * gen_begin status. Thread-safe to create; one thread at a time uses it. */
policy_gen *policy_gen_new(const policy_profile *p, policy_vocab *v, const char *regex,
                           size_t regex_len, corral_error *err);

/* policy_gen_new with the request's constraint in either syntax: a regex, or a JSON Schema's
 * text (CONSTRAINT_JSON_SCHEMA, json_schema.h; its errors name the place in the schema). */
policy_gen *policy_gen_new_as(const policy_profile *p, policy_vocab *v, constraint_syntax syntax,
                              const char *source, size_t source_len, corral_error *err);

/* NULL-safe; sets *g to NULL. */
void policy_gen_destroy(policy_gen **g);

/* The processor to put in gen_params.processor; NULL when nothing restricts the output. Borrowed
 * from g. */
const sampler_processor *policy_gen_processor(policy_gen *g);

#endif /* CORRAL_POLICY_HOST_ */
