/*
 * rewrite_plugin.c — the sample policy plugin (corral_policy_v1) the policy tests load with
 * dlopen. It shows both halves of the ABI and needs nothing from corral but policy.h:
 *
 *   sanitize  every occurrence of `from` in the user text becomes `to` (case-sensitive,
 *             left to right, non-overlapping); text containing `forbid` is rejected
 *             (CORRAL_POLICY_REJECTED); text containing "PLUGIN-FAIL" makes the callback fail
 *             with CORRAL_POLICY_INTERNAL, which must fail that request only.
 *   gen_*     with `ban` set (one byte), no output token may contain that byte: the draw-first
 *             allowed/mask pair of the ABI, over the host's token bytes.
 *
 * Settings: from (required, non-empty), to (required), forbid, ban.
 */
#define CORRAL_POLICY_ABI_ONLY
#include "corral/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rewrite {
    char *from, *to, *forbid;
    int ban; /* -1: none */
} rewrite;

typedef struct rewrite_gen {
    const corral_policy_host *host;
    int ban;
} rewrite_gen;

static void rewrite_destroy(void *instance) {
    rewrite *r = instance;
    if (!r) return;
    free(r->from);
    free(r->to);
    free(r->forbid);
    free(r);
}

static int rewrite_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                        size_t cap) {
    rewrite *r = calloc(1, sizeof *r);
    if (!r) return CORRAL_POLICY_OUT_OF_MEMORY;
    r->ban = -1;
    for (size_t i = 0; i < n; i++) {
        const char *k = kv[i].key, *v = kv[i].value;
        char **slot = !strcmp(k, "from")     ? &r->from
                      : !strcmp(k, "to")     ? &r->to
                      : !strcmp(k, "forbid") ? &r->forbid
                                             : NULL;
        if (slot) {
            free(*slot);
            *slot = strdup(v);
        } else if (!strcmp(k, "ban") && strlen(v) == 1) {
            r->ban = (unsigned char)v[0];
        } else {
            snprintf(msg, cap, "rewrite: unknown or bad setting '%s'", k);
            rewrite_destroy(r);
            return CORRAL_POLICY_INVALID_ARGUMENT;
        }
    }
    if (!r->from || !r->from[0] || !r->to) {
        snprintf(msg, cap, "rewrite: 'from' (non-empty) and 'to' are required");
        rewrite_destroy(r);
        return CORRAL_POLICY_INVALID_ARGUMENT;
    }
    *instance = r;
    return CORRAL_POLICY_OK;
}

/* Occurrences of needle in hay[0..n) (memmem, without relying on _GNU_SOURCE). */
static const char *find(const char *hay, size_t n, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; m && i + m <= n; i++)
        if (memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

static int rewrite_sanitize(void *instance, const corral_policy_host *host, const char *text,
                            size_t len, corral_policy_out *out) {
    (void)host;
    const rewrite *r = instance;
    if (find(text, len, "PLUGIN-FAIL")) {
        snprintf(out->note, sizeof out->note, "asked to fail");
        return CORRAL_POLICY_INTERNAL;
    }
    if (r->forbid && find(text, len, r->forbid)) {
        snprintf(out->note, sizeof out->note, "contains the forbidden word '%s'", r->forbid);
        return CORRAL_POLICY_REJECTED;
    }
    if (!find(text, len, r->from)) return CORRAL_POLICY_KEEP;
    const size_t m = strlen(r->from);
    size_t i = 0;
    for (const char *hit; (hit = find(text + i, len - i, r->from));) {
        const size_t at = (size_t)(hit - text);
        int rc = out->write(out, text + i, at - i);
        if (rc == 0) rc = out->write(out, r->to, strlen(r->to));
        if (rc) return rc;
        out->count++;
        i = at + m;
    }
    const int rc = out->write(out, text + i, len - i);
    if (rc) return rc;
    snprintf(out->note, sizeof out->note, "rewrote %u occurrence%s of '%s'", out->count,
             out->count == 1 ? "" : "s", r->from);
    return CORRAL_POLICY_REWRITE;
}

static int rewrite_gen_begin(void *instance, const corral_policy_host *host, void **gen) {
    const rewrite *r = instance;
    rewrite_gen *g = calloc(1, sizeof *g);
    if (!g) return CORRAL_POLICY_OUT_OF_MEMORY;
    g->host = host;
    g->ban = r->ban;
    *gen = g;
    return CORRAL_POLICY_OK;
}

static int rewrite_gen_allowed(void *gen, int32_t token) {
    const rewrite_gen *g = gen;
    const char *b;
    size_t n;
    if (g->ban < 0) return 1;
    if (g->host->token_bytes(g->host->ctx, token, &b, &n) != 0) return 0;
    return memchr(b, g->ban, n) == NULL;
}

static void rewrite_gen_mask(void *gen, float *logits, int32_t n_vocab) {
    for (int32_t i = 0; i < n_vocab; i++)
        if (!rewrite_gen_allowed(gen, i)) logits[i] = -INFINITY;
}

static int rewrite_gen_accept(void *gen, int32_t token) {
    return rewrite_gen_allowed(gen, token) ? CORRAL_POLICY_OK : CORRAL_POLICY_INVALID_ARGUMENT;
}

static void rewrite_gen_end(void *gen) {
    free(gen);
}

static const corral_policy_v1 rewrite_table = {
    .abi_version = CORRAL_POLICY_ABI_VERSION,
    .struct_size = sizeof(corral_policy_v1),
    .name = "rewrite",
    .description = "rewrite a word in the input; optionally ban a byte from the output",
    .init = rewrite_init,
    .destroy = rewrite_destroy,
    .sanitize = rewrite_sanitize,
    .gen_begin = rewrite_gen_begin,
    .gen_allowed = rewrite_gen_allowed,
    .gen_mask = rewrite_gen_mask,
    .gen_accept = rewrite_gen_accept,
    .gen_end = rewrite_gen_end,
};

const corral_policy_v1 *corral_policy_v1_entry(void);

const corral_policy_v1 *corral_policy_v1_entry(void) {
    return &rewrite_table;
}
