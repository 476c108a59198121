/*
 * suggest.h — "did you mean": the known name closest to one that is not known.
 *
 * Error messages about names (a config key, a chat template, a model, a sanitizer profile) end
 * with the likeliest intended name when one is close enough: a few typed characters wrong,
 * missing, extra or swapped. Closeness is the optimal-string-alignment distance (Levenshtein with
 * adjacent transpositions), compared without regard to ASCII case; a candidate counts when that
 * distance is at most a third of the longer name (and at least 1), so that short names do not
 * match everything.
 */
#ifndef CORRAL_SUGGEST_H
#define CORRAL_SUGGEST_H

#include <stddef.h>

/* The longest name suggest_distance compares; longer ones are never suggested. */
#define SUGGEST_NAME_MAX 128

/* The edit distance between a and b (ASCII case ignored), or SIZE_MAX when either is longer than
 * SUGGEST_NAME_MAX. */
size_t suggest_distance(const char *a, const char *b);

/* The candidate closest to `word` within the threshold above (the first of equals), or NULL.
 * candidates[i] may be NULL (skipped). Borrowed: one of candidates. */
const char *suggest_closest(const char *word, const char *const *candidates, size_t n);

/* Append " (did you mean 'X'?)" for suggest_closest's answer to the NUL-terminated text in
 * buf[0..size), if there is one and it fits. Returns buf. */
char *suggest_append(char *buf, size_t size, const char *word, const char *const *candidates,
                     size_t n);

#endif /* CORRAL_SUGGEST_H */
