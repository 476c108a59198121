/*
 * budget.c — the memory budget's rules (see budget.h for the interface).
 *
 * How corrald keeps its models under memory.limit
 * ------------------------------------------------
 * Everything corral holds for its models is charged to an owner: each model's weights (a file
 * mapping: mapped bytes) and its jemalloc arena (its runner's scratch, the KV caches of its
 * requests and sessions, its requests' buffers). Before anything grows — a model loads, a request
 * or a session gets a KV cache — the caller asks budget_plan whether `need` more bytes fit.
 *
 * Two watermarks keep evictions rare and batched. Under high_watermark × limit nothing happens: the
 * request fits. Above it, idle state is evicted in the policy's order (memory.policy: lru, or
 * lru-cost, which keeps what is expensive to bring back) until the total would be under
 * low_watermark × limit, so that the next requests find room without evicting again — unless the
 * request alone is bigger than the low watermark, in which case eviction stops as soon as it fits
 * under the limit.
 *
 * What can be evicted: idle sessions' KV caches (written to the swap directory, read back when the
 * conversation continues) and idle resident models (their weights unmapped; what is small but slow
 * to rebuild — the tokenizer, the runner's scratch, the policy vocabulary, a few MiB — stays
 * charged to the model, so that a swap-in only maps the weights again). Only when evicting every
 * such candidate is not enough do those kept parts go too, least recently used first. Pinned
 * models and anything a request is using (and the model the room is for) are never candidates.
 *
 * Some evictions are immediate (unmapping), others complete later (a KV cache is written by the
 * loader, off the compute thread, and its memory is freed when the write is done). While such a
 * write is in flight its holder is LEAVING: still counted, never chosen twice. A plan therefore has
 * three good outcomes — the request fits now (after the immediate victims), fits once the writes
 * complete (WAIT: the caller retries then), or cannot fit with what is evictable (FULL: the
 * request waits for other requests to end, up to its deadline or limits.memory_wait_ms, then
 * fails with RESOURCE_EXHAUSTED naming the holders) — and one bad one: it can never fit (NEVER:
 * no eviction can ever help, so the request fails at once instead of waiting for nothing). That
 * is the case when more than the limit is asked for, and when what is asked plus what nothing
 * will ever give back — pinned holders, and the holder the room is for (a model's KV cache needs
 * its model to stay) — is more than the limit.
 */
#include "budget.h"

#include <stdio.h>

static bool candidate(const budget_holder *h) {
    return !(h->flags & (BUDGET_PINNED | BUDGET_IN_USE | BUDGET_LEAVING)) && h->c.bytes > 0;
}

/* a - b, or 0 when b is larger (holders' figures are read at slightly different moments). */
static uint64_t minus(uint64_t a, uint64_t b) {
    return a > b ? a - b : 0;
}

static bool chosen(const size_t *victims, size_t n_victims, size_t i) {
    for (size_t k = 0; k < n_victims; k++)
        if (victims[k] == i) return true;
    return false;
}

/* The next victim: the ordinary candidate the policy scores highest (ties: the earlier one), else
 * the least recently used kept parts; -1 when nothing is left. */
static long next_victim(const budget_params *p, const budget_holder *h, size_t n,
                        const size_t *victims, size_t n_victims, int64_t now_ms) {
    long best = -1;
    double best_score = 0;
    for (size_t i = 0; i < n; i++) {
        if (!candidate(&h[i]) || (h[i].flags & BUDGET_KEPT) || chosen(victims, n_victims, i))
            continue;
        const double score = p->policy->score(&h[i].c, now_ms);
        if (best < 0 || score > best_score) {
            best = (long)i;
            best_score = score;
        }
    }
    if (best >= 0) return best;
    for (size_t i = 0; i < n; i++)
        if (candidate(&h[i]) && (h[i].flags & BUDGET_KEPT) && !chosen(victims, n_victims, i) &&
            (best < 0 || h[i].c.last_used_ms < h[best].c.last_used_ms))
            best = (long)i;
    return best;
}

budget_verdict budget_plan(const budget_params *p, uint64_t total, uint64_t need,
                           const budget_holder *holders, size_t n, int64_t now_ms, size_t *victims,
                           size_t *n_victims) {
    *n_victims = 0;
    if (need > p->limit || need + budget_fixed_bytes(holders, n) > p->limit) return BUDGET_NEVER;
    const uint64_t high = (uint64_t)(p->high * (double)p->limit);
    const uint64_t low = (uint64_t)(p->low * (double)p->limit);
    if (total + need <= high) return BUDGET_FITS;
    const uint64_t target = need > low ? p->limit : low;

    /* Bytes on their way out: the writes in flight, and of the victims chosen here the immediate
     * ones apart from those written later. */
    uint64_t leaving = 0, freed_now = 0, freed_later = 0;
    for (size_t i = 0; i < n; i++)
        if (holders[i].flags & BUDGET_LEAVING) leaving += holders[i].c.bytes;
    while (minus(total, leaving + freed_now + freed_later) + need > target) {
        const long v = next_victim(p, holders, n, victims, *n_victims, now_ms);
        if (v < 0) break;
        victims[(*n_victims)++] = (size_t)v;
        if (holders[v].flags & BUDGET_ASYNC)
            freed_later += holders[v].c.bytes;
        else
            freed_now += holders[v].c.bytes;
    }
    if (minus(total, freed_now) + need <= p->limit) return BUDGET_FITS;
    if (minus(total, leaving + freed_now + freed_later) + need <= p->limit) return BUDGET_WAIT;
    return BUDGET_FULL;
}

uint64_t budget_fixed_bytes(const budget_holder *holders, size_t n) {
    uint64_t fixed = 0;
    for (size_t i = 0; i < n; i++)
        if (holders[i].flags & (BUDGET_PINNED | BUDGET_TARGET)) fixed += holders[i].c.bytes;
    return fixed;
}

void budget_describe(const budget_params *p, const budget_holder *holders, size_t n, char *out,
                     size_t size) {
    if (size == 0) return;
    size_t len =
        (size_t)snprintf(out, size, "memory limit %.1f MiB is held by:", p->limit / 1048576.0);
    int any = 0;
    for (size_t i = 0; i < n && len < size; i++) {
        const budget_holder *h = &holders[i];
        if (!h->c.bytes) continue;
        const uint32_t f = h->flags;
        len += (size_t)snprintf(
            out + len, size - len, "%s %s '%s' %.1f MiB%s%s%s%s", any++ ? "," : "",
            h->c.kind == EVICT_KIND_SESSION ? "session" : "model", h->name ? h->name : "?",
            h->c.bytes / 1048576.0, f & BUDGET_PINNED ? " (pinned)" : "",
            f & BUDGET_IN_USE ? " (requests running)" : "",
            f & BUDGET_KEPT ? " (swapped out, tokenizer and scratch kept)" : "",
            f & BUDGET_LEAVING ? " (being written to the swap directory)" : "");
    }
    if (!any && len < size) snprintf(out + len, size - len, " nothing evictable");
}
