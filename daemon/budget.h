/*
 * budget.h — corrald's memory budget: given what holds memory and what is asked for, which state
 * to evict, and whether the request fits now, later, or not at all.
 *
 * The module is pure: it sees memory as a list of holders (budget_holder: a resident model, a
 * session's KV cache, what a swapped-out model kept), each with its bytes, its last use and what
 * bringing it back would cost, and it chooses victims in the order of the eviction policy
 * (policies/evict.h). Carrying out an eviction — unmapping weights, writing a KV cache to the swap
 * directory — is the caller's (daemon/residency.c, session.c), so the rules here are unit-tested
 * with fake holders, no daemon needed (tests/unit/test_budget.c). budget.c explains the rules.
 */
#ifndef CORRAL_DAEMON_BUDGET_H
#define CORRAL_DAEMON_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/evict.h"

/* The budget's settings (config `memory`). */
typedef struct budget_params {
    uint64_t limit;   /* bytes corral may hold for its models */
    double high, low; /* watermarks, fractions of limit: 0 < low <= high <= 1 */
    const evict_policy *policy;
} budget_params;

/* What a holder is and may do. */
enum {
    BUDGET_PINNED = 1u << 0,  /* never evicted (a pinned model) */
    BUDGET_IN_USE = 1u << 1,  /* a request uses it, or the room is for it: never evicted */
    BUDGET_KEPT = 1u << 2,    /* what a swapped-out model kept (tokenizer, scratch): evicted
                                 only when nothing else is left, oldest first */
    BUDGET_ASYNC = 1u << 3,   /* its eviction completes later (a write): its bytes are gone only
                                 then */
    BUDGET_LEAVING = 1u << 4, /* its eviction is in flight: counted, not a candidate again */
    BUDGET_TARGET = 1u << 5,  /* the room is for it (its model, resident): it stays whatever
                                 ends, so its bytes count against what can ever fit */
};

typedef struct budget_holder {
    evict_candidate c; /* kind, last use, bytes held, return costs, the caller's handle */
    const char *name;  /* for messages: the model's or session's name */
    uint32_t flags;    /* BUDGET_* */
} budget_holder;

/* The outcome of a plan. */
typedef enum budget_verdict {
    BUDGET_FITS = 0,  /* there is room once the synchronous victims are evicted */
    BUDGET_WAIT = 1,  /* there will be room once the evictions in flight (and the asynchronous
                         victims chosen now) complete */
    BUDGET_FULL = 2,  /* not enough can be evicted: room may come when requests end */
    BUDGET_NEVER = 3, /* it can never fit: more than the whole limit is asked for, or more than
                         what pinned holders and the target leave of it (budget_fixed_bytes) */
} budget_verdict;

/* Plan room for `need` more bytes, with `total` bytes held now (every holder, plus reservations
 * for loads in flight). Writes the victims to evict now, in order, as indices into holders[0..n),
 * to victims[] (room for n) and their count to *n_victims. Reads the holders only. */
budget_verdict budget_plan(const budget_params *p, uint64_t total, uint64_t need,
                           const budget_holder *holders, size_t n, int64_t now_ms, size_t *victims,
                           size_t *n_victims);

/* Bytes no eviction and no request's end can give back: pinned holders and the target's. */
uint64_t budget_fixed_bytes(const budget_holder *holders, size_t n);

/* Write "memory limit L MiB is held by: model 'a' 600.0 MiB (pinned), ..." naming every holder
 * with bytes, for the error of a request that cannot get room. */
void budget_describe(const budget_params *p, const budget_holder *holders, size_t n, char *out,
                     size_t size);

#endif /* CORRAL_DAEMON_BUDGET_H */
