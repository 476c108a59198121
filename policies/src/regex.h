/*
 * regex.h — private to policies/: ECMAScript-like regular expressions compiled to minimal DFAs
 * over bytes. Used by the output constraints (constraint.c: the whole output must match) and by
 * the `deny` sanitizer (sanitize.c: search anywhere in the input).
 *
 * The syntax is the part of ECMAScript's that a DFA can express:
 *   literals (any UTF-8 text), `.` (any character but \n \r U+2028 U+2029), classes `[a-z…]` and
 *   `[^…]` with ranges, `\d \D \w \W \s \S` (ECMAScript's ASCII \d \w, Unicode \s), escapes
 *   `\n \r \t \f \v \0 \cX \xHH \uHHHH \u{H…}` (a \uD8xx\uDCxx pair is one code point) and the
 *   identity escapes of punctuation, groups `( )` `(?: )` `(?<name> )`, alternation `|`,
 *   quantifiers `* + ? {m} {m,} {m,n}` (a trailing `?` — laziness — changes nothing for a whole
 *   match), `^` at the start of the pattern or of a top-level alternative and `$` at its end
 *   (no-ops: the whole output is matched anyway). As in ECMAScript's Annex B, a `{` that does not
 *   start a quantifier and a lone `}` or `]` are literals; `[]` matches nothing and `[^]` any
 *   character.
 * Refused, with an error naming the construct: backreferences, lookahead and lookbehind, `\b`
 * and `\B`, `\p{…}`, anchors elsewhere, lone surrogates, flags groups, malformed syntax.
 *
 * The language is over code points; the automaton is over their UTF-8 bytes (each class becomes
 * the byte sequences of its code points), so every string it accepts is valid UTF-8. Bytes are
 * grouped into classes that the automaton cannot tell apart, so a table row is n_classes wide.
 * Construction: parse to a tree, Thompson NFA over byte ranges, subset construction, removal of
 * the states from which no accepting state can be reached, Moore partition refinement, merge of
 * equal byte classes, breadth-first renumbering (state 0 is the start).
 */
#ifndef CORRAL_POLICIES_REGEX_H
#define CORRAL_POLICIES_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

/* Limits, checked before the work they bound. */
#define REGEX_MAX_PATTERN    8192   /* bytes of pattern */
#define REGEX_MAX_REPEAT     1000   /* largest m or n in {m,n} */
#define REGEX_MAX_DEPTH      128    /* nesting of groups */
#define REGEX_MAX_NFA_STATES 200000 /* after repetitions are expanded */
#define REGEX_MAX_DFA_STATES 10000  /* before minimisation */

/* A transition to nowhere: the input can no longer match. */
#define REGEX_DEAD (-1)

/* Compile flags. */
enum {
    REGEX_CASELESS = 1u << 0, /* ASCII letters match either case */
    REGEX_SEARCH = 1u << 1,   /* accept any bytes before the pattern: the DFA reaches an accepting
                                 state at the end of the first match found anywhere */
};

typedef struct regex_dfa {
    uint32_t n_states; /* >= 1; state 0 is the start */
    uint32_t n_classes;
    uint8_t byte_class[256]; /* byte -> column */
    int32_t *next;           /* [n_states][n_classes]: next state or REGEX_DEAD */
    uint8_t *accepting;      /* [n_states] */
    uint8_t *final;          /* [n_states]: accepting with no transition at all */
} regex_dfa;

/* Compile pattern[0..len) with flags into *out (zeroed first; free with regex__free). Returns
 * CORRAL_OK; CORRAL_INVALID_ARGUMENT for a syntax error, an unsupported construct or a pattern
 * that matches nothing, the message naming it and its byte offset ("backreferences are not
 * supported (\1 at offset 4)"); CORRAL_RESOURCE_EXHAUSTED when a limit above is exceeded;
 * CORRAL_OUT_OF_MEMORY. Thread-safe. */
corral_status regex__compile(const char *pattern, size_t len, uint32_t flags, regex_dfa *out,
                             corral_error *err);

/* Free what regex__compile allocated and zero *d. NULL-safe. */
void regex__free(regex_dfa *d);

/* The state after byte b from state s (s must not be REGEX_DEAD). */
static inline int32_t regex__step(const regex_dfa *d, int32_t s, uint8_t b) {
    return d->next[(size_t)s * d->n_classes + d->byte_class[b]];
}

/* Run the DFA over s[0..n) from state `from`: the state reached, or REGEX_DEAD. */
int32_t regex__run(const regex_dfa *d, int32_t from, const char *s, size_t n);

/* 1 if the whole of s[0..n) is in the language (from the start state). */
int regex__match(const regex_dfa *d, const char *s, size_t n);

#endif /* CORRAL_POLICIES_REGEX_H */
