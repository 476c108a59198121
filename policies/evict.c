/*
 * evict.c — the eviction policy table (see evict.h for the policies and why).
 */
#include "corral/evict.h"

#include <stddef.h>
#include <string.h>

static double idle_ms(const evict_candidate *c, int64_t now_ms) {
    const int64_t idle = now_ms - c->last_used_ms;
    return idle > 0 ? (double)idle : 0.0;
}

static double score_lru(const evict_candidate *c, int64_t now_ms) {
    return idle_ms(c, now_ms);
}

static double score_lru_cost(const evict_candidate *c, int64_t now_ms) {
    const double cost_s = (double)c->reload_bytes / EVICT_DISK_BYTES_PER_S + c->rebuild_us / 1e6;
    return idle_ms(c, now_ms) / (1.0 + cost_s);
}

static const evict_policy evict_policies[] = {
    {.name = "lru", .score = score_lru, .doc = "least recently used first"},
    {.name = "lru-cost",
     .score = score_lru_cost,
     .doc = "idle time divided by (1 + seconds to bring the state back)"},
};

const evict_policy *evict_policy_find(const char *name) {
    for (size_t i = 0; name && i < sizeof evict_policies / sizeof evict_policies[0]; i++)
        if (strcmp(evict_policies[i].name, name) == 0) return &evict_policies[i];
    return NULL;
}

const char *evict_policy_names(void) {
    return "lru, lru-cost";
}

int evict_pick(const evict_policy *p, const evict_candidate *c, int n, int64_t now_ms) {
    int best = -1;
    double best_score = 0.0;
    for (int i = 0; i < n; i++) {
        const double s = p->score(&c[i], now_ms);
        if (best < 0 || s > best_score) {
            best = i;
            best_score = s;
        }
    }
    return best;
}
