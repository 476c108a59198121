/*
 * evict.h — which state to push out of memory first when corrald must make room.
 *
 * The memory manager (daemon/) lists what it could evict — idle models, idle sessions' KV caches
 * — as candidates with what each frees and what bringing it back would cost; a policy gives each
 * candidate a score, and the highest score goes first. Policies are rows of a table, chosen by
 * name in the config (`memory.policy`):
 *
 *   lru       least recently used first: score = idle time. Simple and predictable; what the
 *             tests' "LRU predicts the swap counters" check relies on.
 *   lru-cost  idle time weighed by what a return would cost: score = idle time / (1 + cost),
 *             cost = reload_bytes / EVICT_DISK_BYTES_PER_S + rebuild_us / 1e6, in seconds. Between
 *             two equally idle candidates, the one that comes back cheaply (a small model in page
 *             cache, a short KV cache) goes first; a model whose merged or repacked weights would
 *             have to be rebuilt stays longer.
 *
 * Pinned models and state in use are never candidates: the caller leaves them out.
 */
#ifndef CORRAL_EVICT_H
#define CORRAL_EVICT_H

#include <stdint.h>

/* Sequential read speed assumed for reload costs (a SATA-class SSD). */
#define EVICT_DISK_BYTES_PER_S (500.0 * 1024 * 1024)

typedef enum evict_kind {
    EVICT_KIND_MODEL = 0,   /* unmap a model's weights (and swap out its sessions) */
    EVICT_KIND_SESSION = 1, /* write a session's KV cache to the swap directory */
} evict_kind;

typedef struct evict_candidate {
    evict_kind kind;
    int64_t last_used_ms;  /* Unix time of the last use */
    uint64_t bytes;        /* memory evicting it frees */
    uint64_t reload_bytes; /* bytes to read to bring it back */
    uint64_t rebuild_us;   /* extra work to rebuild it if its image is lost (merge, repack) */
    void *user;            /* the caller's handle */
} evict_candidate;

typedef struct evict_policy {
    const char *name;
    /* Higher scores are evicted first. now_ms: Unix time in ms. */
    double (*score)(const evict_candidate *c, int64_t now_ms);
    const char *doc;
} evict_policy;

/* The policy called name ("lru", "lru-cost"), or NULL. Thread-safe; the table is static. */
const evict_policy *evict_policy_find(const char *name);

/* The names of all policies, comma-separated, for messages. */
const char *evict_policy_names(void);

/* The index of the candidate to evict first (highest score; ties: the earlier one), or -1 when
 * n is 0. */
int evict_pick(const evict_policy *p, const evict_candidate *c, int n, int64_t now_ms);

#endif /* CORRAL_EVICT_H */
