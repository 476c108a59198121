/*
 * progress.h — how long work tells its caller how far it got.
 *
 * Work that takes seconds (rearranging a model's weights, merging adapters, writing a synthetic
 * model, a benchmark's runs) takes an optional corral_progress callback and calls it as it goes:
 * `done` of `total` units, total 0 when the work cannot say how much there is. The caller decides
 * what to do with it: corrald turns it into Progress messages for the requests waiting, the
 * `corral` command into a progress bar on a terminal.
 *
 * The callback runs on the thread doing the work, between units, so it must be cheap and must not
 * call back into the work (the optional pace callback may block, and nothing else). Calls come in
 * order, `done` never decreasing within one piece of work.
 */
#ifndef CORRAL_PROGRESS_H
#define CORRAL_PROGRESS_H

#include <stdint.h>

typedef void (*corral_progress_fn)(void *user, uint64_t done, uint64_t total);

/* A callback and its argument, the form the work's parameters carry (fn NULL: none). */
typedef struct corral_progress {
    corral_progress_fn fn;
    void *user;
    /* Optional (NULL: none): called, with `user`, between steps smaller than the units reported
     * (a tensor's bytes written in pieces), where the caller may hold the work back for a while:
     * corrald's loader steps aside there while realtime work is computed. */
    void (*pace)(void *user);
} corral_progress;

/* Report `done` of `total` through p, if it has a callback. */
static inline void corral_progress_report(const corral_progress *p, uint64_t done, uint64_t total) {
    if (p && p->fn) p->fn(p->user, done, total);
}

/* A point where p's caller may hold the work back (its pace callback), if it has one. */
static inline void corral_progress_pace(const corral_progress *p) {
    if (p && p->pace) p->pace(p->user);
}

#endif /* CORRAL_PROGRESS_H */
