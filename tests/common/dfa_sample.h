/*
 * dfa_sample.h — random strings a compiled regex accepts (policies' private regex_dfa), for tests
 * and fuzz targets that check what a pattern admits rather than what it rejects.
 *
 * A walk from the start state takes random bytes that keep it alive (every state of the DFA can
 * still reach an accepting one: the compiler drops the others) and stops at an accepting state
 * with probability 1/4. Past `soft` bytes it only takes bytes that bring it closer to an accepting
 * state (by the distances dfa_sample_distances computes), so it always ends, within
 * soft + the longest distance.
 */
#ifndef CORRAL_TEST_DFA_SAMPLE_H
#define CORRAL_TEST_DFA_SAMPLE_H

#include <stdint.h>
#include <stdlib.h>

#include "regex.h" /* policies/src */
#include "testutil.h"

/* Bytes from each state to the nearest accepting one ([n_states], malloc'ed; caller frees).
 * Relaxation until nothing changes: fine for test-sized automata. */
static inline uint32_t *dfa_sample_distances(const regex_dfa *d) {
    uint32_t *dist = malloc(d->n_states * sizeof *dist);
    if (!dist) return NULL;
    for (uint32_t s = 0; s < d->n_states; s++) dist[s] = d->accepting[s] ? 0 : UINT32_MAX;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = 0; s < d->n_states; s++) {
            for (uint32_t c = 0; c < d->n_classes; c++) {
                const int32_t t = d->next[(size_t)s * d->n_classes + c];
                if (t == REGEX_DEAD || dist[t] == UINT32_MAX || dist[t] + 1 >= dist[s]) continue;
                dist[s] = dist[t] + 1;
                changed = 1;
            }
        }
    }
    return dist;
}

/* One random accepted string into out (NUL-terminated); its length, or SIZE_MAX when it would not
 * fit in cap bytes. rng is a test_splitmix64 state. */
static inline size_t dfa_sample(const regex_dfa *d, const uint32_t *dist, uint64_t *rng, char *out,
                                size_t cap, size_t soft) {
    int32_t s = 0;
    size_t n = 0;
    for (;;) {
        const int final = d->final[s];
        if (d->accepting[s] && (final || test_splitmix64(rng) % 4 == 0)) break;
        uint8_t ok[256];
        int n_ok = 0;
        for (int b = 0; b < 256; b++) {
            const int32_t t = regex__step(d, s, (uint8_t)b);
            if (t == REGEX_DEAD) continue;
            if (n >= soft && dist[t] >= dist[s]) continue;
            ok[n_ok++] = (uint8_t)b;
        }
        if (n_ok == 0) { /* only at an accepting state past soft */
            if (d->accepting[s]) break;
            return SIZE_MAX;
        }
        /* Printable ASCII half of the time: strings stay readable and short. */
        uint8_t b = ok[test_splitmix64(rng) % (uint64_t)n_ok];
        if (test_splitmix64(rng) % 2) {
            int n_ascii = 0;
            for (int i = 0; i < n_ok; i++) n_ascii += ok[i] >= 0x20 && ok[i] < 0x7F;
            if (n_ascii) {
                int k = (int)(test_splitmix64(rng) % (uint64_t)n_ascii);
                for (int i = 0; i < n_ok; i++)
                    if (ok[i] >= 0x20 && ok[i] < 0x7F && k-- == 0) b = ok[i];
            }
        }
        if (n + 2 > cap) return SIZE_MAX;
        out[n++] = (char)b;
        s = regex__step(d, s, b);
    }
    out[n] = '\0';
    return n;
}

#endif /* CORRAL_TEST_DFA_SAMPLE_H */
