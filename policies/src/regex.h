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
 * the states from which no accepting state can be reached, Hopcroft's partition refinement, merge
 * of equal byte classes, breadth-first renumbering (state 0 is the start).
 */
#ifndef CORRAL_POLICIES_REGEX_H
#define CORRAL_POLICIES_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

/* The compile budget. Patterns come from untrusted clients, and a short one can ask for an
 * automaton of any size (`((a|b){0,12}){0,1000}` is 21 bytes), so every stage is bounded, each
 * limit checked before the work or the allocation it bounds. Over one, the compile fails with
 * CORRAL_RESOURCE_EXHAUSTED and a message naming the limit, and the construct and its offset
 * where one construct is to blame. Together they hold any pattern to some 50 ms of CPU and
 * 32 MiB (with a lot of headroom left for the patterns of a typical schema).
 *   REGEX_MAX_PATTERN       the text: 8 KiB is far above any hand-written pattern.
 *   REGEX_MAX_GENERATED_PATTERN  the text of a pattern corral wrote itself from a smaller source
 *                           (REGEX_GENERATED: json_schema.c). Such a text repeats its building
 *                           blocks (a JSON string's escapes, the separators) for every field, so
 *                           it is long for what it asks; the limits below still bound its cost.
 *   REGEX_MAX_REPEAT        one count of {m,n}: each count is a copy of its atom; 1000 covers
 *                           `[A-Za-z ]{1,200}`-like fields with room.
 *   REGEX_MAX_DEPTH         nesting of groups: bounds the parser's recursion, not the work.
 *   REGEX_MAX_GENERATED_DEPTH  the same for REGEX_GENERATED: a JSON schema's object of n optional
 *                           properties nests n groups (json_schema.c); each level costs the
 *                           parser and the NFA builder a few hundred bytes of stack.
 *   REGEX_MAX_NFA_STATES    the Thompson NFA once {m,n} are expanded into copies. A repetition
 *   REGEX_MAX_NFA_EDGES     builds its body once and checks all its copies against these before
 *                           making any, so `((a{100}){100}){100}` fails at the outer {100} with
 *                           nothing allocated for it. Typical patterns need a few thousand.
 *   REGEX_MAX_DFA_STATES    states made by the subset construction (before minimisation): bounds
 *                           the table, and with it the later stages. `(a|b)*a(a|b){20}` needs 2^21.
 *   REGEX_MAX_GENERATED_DFA_STATES  the same for REGEX_GENERATED: a schema's counts multiply (an
 *                           array of 3 objects with two strings of at most 30 characters is
 *                           3 x 2 x 30 copies of a JSON character's ~20 states); the work and
 *                           bytes limits still hold such a compile to some 50 ms and 32 MiB.
 *   REGEX_MAX_COMPILE_WORK  steps, a deterministic stand-in for time: the NFA states and epsilon
 *                           edges the closures visit, the states they sort, the (edge, byte class)
 *                           pairs of the transitions, and the table cells the later stages read
 *                           and write. It is what stops a pattern whose DFA is small but whose
 *                           subsets are large (a nullable body repeated: `((a|b){0,12}){0,1000}`
 *                           would visit some 10^9 NFA states). A step is 1-3 ns of CPU here, so
 *                           the limit is 20-50 ms; the typical patterns in the tests take < 30%.
 *   REGEX_MAX_COMPILE_BYTES bytes the compile holds at once, the finished DFA included: every
 *                           allocation goes through the compiler's helper, which counts them
 *                           and refuses one that would pass the limit. An 8 KiB literal of text
 *                           over most byte values (the widest table a pattern can ask for without
 *                           hitting the other limits) needs about 17 MiB.
 */
#define REGEX_MAX_PATTERN              8192          /* bytes of pattern */
#define REGEX_MAX_GENERATED_PATTERN    (256u << 10)  /* bytes of a REGEX_GENERATED pattern */
#define REGEX_MAX_REPEAT               1000          /* largest m or n in {m,n} */
#define REGEX_MAX_DEPTH                128           /* nesting of groups */
#define REGEX_MAX_GENERATED_DEPTH      512           /* nesting of groups, REGEX_GENERATED */
#define REGEX_MAX_NFA_STATES           200000        /* after repetitions are expanded */
#define REGEX_MAX_NFA_EDGES            800000        /* likewise */
#define REGEX_MAX_DFA_STATES           10000         /* before minimisation */
#define REGEX_MAX_GENERATED_DFA_STATES 40000         /* before minimisation, REGEX_GENERATED */
#define REGEX_MAX_COMPILE_WORK         20000000ull   /* steps */
#define REGEX_MAX_COMPILE_BYTES        (32ull << 20) /* held at once */

/* A transition to nowhere: the input can no longer match. */
#define REGEX_DEAD (-1)

/* Compile flags. */
enum {
    REGEX_CASELESS = 1u << 0,  /* ASCII letters match either case */
    REGEX_SEARCH = 1u << 1,    /* accept any bytes before the pattern: the DFA reaches an accepting
                                  state at the end of the first match found anywhere */
    REGEX_GENERATED = 1u << 2, /* written by corral from a smaller source (a JSON schema): up to
                                  REGEX_MAX_GENERATED_PATTERN bytes, REGEX_MAX_GENERATED_DEPTH
                                  nested groups, REGEX_MAX_GENERATED_DFA_STATES; every other
                                  limit applies */
};

typedef struct regex_dfa {
    uint32_t n_states; /* >= 1; state 0 is the start */
    uint32_t n_classes;
    uint8_t byte_class[256]; /* byte -> column */
    int32_t *next;           /* [n_states][n_classes]: next state or REGEX_DEAD */
    uint8_t *accepting;      /* [n_states] */
    uint8_t *final;          /* [n_states]: accepting with no transition at all */
} regex_dfa;

/* What a compile cost, against the limits above: filled whether or not it succeeds. */
typedef struct regex_stats {
    uint32_t nfa_states, nfa_edges; /* the NFA as far as it was built */
    uint32_t dfa_states;            /* made by the subset construction, before minimisation */
    uint64_t work;                  /* steps, <= REGEX_MAX_COMPILE_WORK */
    uint64_t peak_bytes;            /* most bytes held at once, <= REGEX_MAX_COMPILE_BYTES */
} regex_stats;

/* Compile pattern[0..len) with flags into *out (zeroed first; free with regex__free). Returns
 * CORRAL_OK; CORRAL_INVALID_ARGUMENT for a syntax error, an unsupported construct or a pattern
 * that matches nothing, the message naming it and its byte offset ("backreferences are not
 * supported (\1 at offset 4)"); CORRAL_RESOURCE_EXHAUSTED when a limit above is reached, the
 * message naming the limit ("... (limit REGEX_MAX_DFA_STATES)"); CORRAL_OUT_OF_MEMORY. stats, if
 * not NULL, receives the costs (on failure too). Time and memory are linear in the pattern's
 * length for a pattern without repetitions, and bounded by the limits for any pattern.
 * Thread-safe. */
corral_status regex__compile(const char *pattern, size_t len, uint32_t flags, regex_dfa *out,
                             regex_stats *stats, corral_error *err);

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

/* ---- writing patterns ------------------------------------------------------------------------
 *
 * A growing pattern text with a size limit, for code that writes patterns (json_schema.c) and for
 * regex__rewrite. A write past the limit or a failed allocation leaves the text as it was and
 * records the first failure in `status` (CORRAL_RESOURCE_EXHAUSTED / CORRAL_OUT_OF_MEMORY); every
 * later write is then a no-op, so a writer checks once, at the end.
 */
typedef struct regex_text {
    char *data; /* NUL-terminated once anything was written; malloc'ed, the owner frees it */
    size_t len, cap;
    size_t limit;         /* most bytes the text may hold */
    corral_status status; /* CORRAL_OK until a write fails */
} regex_text;

/* Append s[0..n) / a formatted string. False (and nothing appended) once the text has failed. */
bool regex__text_put(regex_text *t, const char *s, size_t n);
bool regex__text_puts(regex_text *t, const char *s);
bool regex__text_printf(regex_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append code point cp as a pattern literal that means exactly that character in any context
 * (outside or inside a class): letters and digits as themselves, the rest as \uXXXX / \u{X}. */
bool regex__text_put_cp(regex_text *t, uint32_t cp);

/* How regex__rewrite writes a pattern over another alphabet. */
typedef struct regex_rewrite {
    /* Append to out an atom (a self-contained pattern: it is quantified and concatenated as it is)
     * matching what one character of the set stands for: ranges[0..n) of code points, sorted,
     * disjoint and without surrogates (n = 0: a set that matches nothing). False on failure (the
     * failure recorded in out->status). */
    bool (*set)(void *user, const uint32_t (*ranges)[2], size_t n, regex_text *out);
    void *user;
    /* Written where a top-level alternative has no `^` at its start or no `$` at its end, to give
     * a whole-match pattern the meaning of a search (e.g. "(?:X)*" for "any characters here"); NULL
     * to keep the whole-match meaning. */
    const char *unanchored;
} regex_rewrite;

/* Parse pattern[0..len) (the syntax above, no flags) and append to out the same structure with
 * every character set written by how->set and, with how->unanchored, the unanchored ends filled.
 * Groups become (?:...), quantifiers are kept as counts, anchors disappear. CORRAL_OK; the parse's
 * errors as regex__compile ("regex: lookahead (?=...) is not supported (at offset 3)");
 * out->status when the text fails (nothing is then promised about out). Linear in the pattern.
 * Thread-safe. */
corral_status regex__rewrite(const char *pattern, size_t len, const regex_rewrite *how,
                             regex_text *out, corral_error *err);

#endif /* CORRAL_POLICIES_REGEX_H */
