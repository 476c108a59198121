/*
 * broken_plugin.c — plugins that must be refused at load, one per compile definition:
 *   BROKEN_ABI      a table that claims ABI version 99;
 *   BROKEN_NO_ENTRY no corral_policy_v1_entry symbol at all;
 *   BROKEN_TABLE    gen_mask without gen_allowed (the ABI says they come together).
 */
#define CORRAL_POLICY_ABI_ONLY
#include "corral/policy.h"

#include <stddef.h>

static int broken_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                       size_t cap) {
    (void)kv, (void)n, (void)msg, (void)cap;
    *instance = NULL;
    return CORRAL_POLICY_OK;
}

static int broken_sanitize(void *instance, const corral_policy_host *host, const char *text,
                           size_t len, corral_policy_out *out) {
    (void)instance, (void)host, (void)text, (void)len, (void)out;
    return CORRAL_POLICY_KEEP;
}

__attribute__((unused)) static int broken_begin(void *instance, const corral_policy_host *host,
                                                void **gen) {
    (void)instance, (void)host;
    *gen = NULL;
    return CORRAL_POLICY_OK;
}

__attribute__((unused)) static void broken_mask(void *gen, float *logits, int32_t n_vocab) {
    (void)gen, (void)logits, (void)n_vocab;
}

#ifdef BROKEN_NO_ENTRY
/* The table exists, under the wrong name. */
const corral_policy_v1 *corral_policy_entry(void);
const corral_policy_v1 *corral_policy_entry(void) {
    static const corral_policy_v1 t = {.abi_version = CORRAL_POLICY_ABI_VERSION,
                                       .struct_size = sizeof t,
                                       .name = "broken",
                                       .init = broken_init,
                                       .sanitize = broken_sanitize};
    return &t;
}
#else
static const corral_policy_v1 table = {
#ifdef BROKEN_ABI
    .abi_version = 99,
#else
    .abi_version = CORRAL_POLICY_ABI_VERSION,
#endif
    .struct_size = sizeof(corral_policy_v1),
    .name = "broken",
    .init = broken_init,
    .sanitize = broken_sanitize,
#ifdef BROKEN_TABLE
    .gen_begin = broken_begin,
    .gen_mask = broken_mask,
#endif
};

const corral_policy_v1 *corral_policy_v1_entry(void);
const corral_policy_v1 *corral_policy_v1_entry(void) {
    (void)broken_begin, (void)broken_mask;
    return &table;
}
#endif
