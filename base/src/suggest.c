/*
 * suggest.c — the closest known name to an unknown one (see suggest.h).
 *
 * The distance is computed with the classic dynamic programme over two rows plus the one before
 * them (for transpositions), on the stack: names are short, and an error path must not allocate.
 */
#include "corral/suggest.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t min3(size_t a, size_t b, size_t c) {
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

size_t suggest_distance(const char *a, const char *b) {
    const size_t n = strlen(a), m = strlen(b);
    if (n > SUGGEST_NAME_MAX || m > SUGGEST_NAME_MAX) return SIZE_MAX;
    size_t rows[3][SUGGEST_NAME_MAX + 1];
    size_t *before = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        const int ca = tolower((unsigned char)a[i - 1]);
        for (size_t j = 1; j <= m; j++) {
            const int cb = tolower((unsigned char)b[j - 1]);
            const size_t cost = ca == cb ? 0 : 1;
            cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && before[j - 2] + 1 < cur[j])
                cur[j] = before[j - 2] + 1;
        }
        size_t *t = before;
        before = prev;
        prev = cur;
        cur = t;
    }
    return prev[m];
}

const char *suggest_closest(const char *word, const char *const *candidates, size_t n) {
    if (!word || !word[0]) return NULL;
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (!candidates[i] || !candidates[i][0]) continue;
        const size_t d = suggest_distance(word, candidates[i]);
        const size_t longer =
            strlen(word) > strlen(candidates[i]) ? strlen(word) : strlen(candidates[i]);
        size_t limit = longer / 3;
        if (limit < 1) limit = 1;
        if (d <= limit && d < best_d) {
            best = candidates[i];
            best_d = d;
        }
    }
    return best;
}

char *suggest_append(char *buf, size_t size, const char *word, const char *const *candidates,
                     size_t n) {
    const char *s = suggest_closest(word, candidates, n);
    const size_t len = strnlen(buf, size);
    if (s && len < size) snprintf(buf + len, size - len, " (did you mean '%s'?)", s);
    return buf;
}
