/*
 * sanitize.h — the built-in input sanitizers, and the report a sanitizer run produces.
 *
 * Whatever a client sends is text, never control: corral tokenizes user text with special-token
 * parsing off (prompt.h), and these steps add what a profile asks on top. Each is a policy
 * (policy.h) built from key/value settings; a profile runs them in the configured order:
 *
 *   utf8             reject (CORRAL_SANITIZER_REJECTED naming the byte offset) or repair (each
 *                    maximal ill-formed subsequence becomes U+FFFD, as WHATWG decoders do)
 *                    invalid UTF-8: overlong forms, surrogates, values above U+10FFFF, stray or
 *                    missing continuation bytes, bytes C0 C1 F5..FF.
 *   invisible        strip Unicode control (Cc: NUL and C1 included), format (Cf: zero-width
 *                    characters, bidirectional controls, tag characters, soft hyphen, BOM) and
 *                    private-use (Co) characters, except \n, \t and \r (\r is a line break in
 *                    old Mac and Windows text; normalize_space turns it into \n, and dropping
 *                    it would join lines). Bytes that are not valid UTF-8 pass unchanged (put
 *                    utf8 first).
 *   special_tokens   find the model's special-token texts (<|im_end|>, </s>, <|User|>, ...) in the
 *                    text: `keep` leaves them as plain text (the tokenizer never parses them in
 *                    user text; the report flags them), `strip` removes them — repeatedly, so
 *                    that removing one cannot splice another together.
 *   max_input        reject text over `bytes` bytes or `tokens` tokens (counted with the model's
 *                    tokenizer, without BOS/EOS).
 *   deny             reject text in which any named regex (constraint.h syntax, found anywhere)
 *                    occurs; the report and the error name the rule. Each rule is compiled once,
 *                    at init, within constraint.h's compile limits (a rule over one fails init
 *                    with CORRAL_RESOURCE_EXHAUSTED naming the rule and the limit).
 *   normalize_space  \r\n and \r become \n; with `collapse`, each run of horizontal white space
 *                    (space, tab, \v, \f, NBSP and the other Unicode space separators) becomes
 *                    one space; with `trim`, runs at the start and end of every line and of the
 *                    text are removed, as are leading and trailing newlines; more than
 *                    max_newlines newlines in a row (blank lines between) become max_newlines.
 *                    Prompts that differ only in spacing then tokenize equally, which makes
 *                    session prefix reuse effective. (Indentation does not survive: do not use
 *                    it for code.)
 *
 * Every step adds one line to a sanitize_report: its name, a verdict, a count and a note.
 */
#ifndef CORRAL_SANITIZE_H
#define CORRAL_SANITIZE_H

#include <stddef.h>
#include <stdint.h>

#define SANITIZE_MAX_STEPS 32

typedef enum sanitize_verdict {
    SANITIZE_PASSED = 0,   /* nothing to do */
    SANITIZE_CHANGED = 1,  /* the text was rewritten */
    SANITIZE_FLAGGED = 2,  /* unchanged, but something was noticed (special tokens kept) */
    SANITIZE_REJECTED = 3, /* the input was refused; no later step ran */
} sanitize_verdict;

typedef struct sanitize_step_report {
    char step[32]; /* the policy's name */
    sanitize_verdict verdict;
    uint32_t count; /* what the step acted on: bytes repaired, characters removed, tokens, ... */
    char note[160]; /* one line: "replaced 2 invalid sequences with U+FFFD" */
} sanitize_step_report;

typedef struct sanitize_report {
    uint32_t n_steps;
    sanitize_step_report steps[SANITIZE_MAX_STEPS];
    uint64_t bytes_in, bytes_out;
} sanitize_report;

/* "passed", "changed", "flagged", "rejected"; "?" otherwise. Static. */
const char *sanitize_verdict_name(sanitize_verdict v);

/* Write the report as one line, "utf8=passed invisible=changed(2: removed 2 format characters)
 * ...", into buf (NUL-terminated, truncated to cap). Returns the length it needed (snprintf's
 * convention). For Done/Error messages and logs. */
size_t sanitize_report_format(const sanitize_report *r, char *buf, size_t cap);

struct corral_policy_v1;

/* The built-in sanitizer called name (one of the six above) as a policy table, or NULL.
 * Static; thread-safe. */
const struct corral_policy_v1 *sanitize_builtin(const char *name);

/* 1 if the invisible step removes code point cp (Cc except \n \t \r, Cf, Co; Unicode 15.0). */
int sanitize_is_invisible(uint32_t cp);

#endif /* CORRAL_SANITIZE_H */
