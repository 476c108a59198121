/*
 * test_policy_plugin.c — Check suite for the policy plugin ABI (policies/include/corral/
 * policy.h): the sample plugin built in tests/plugins is loaded with dlopen through a profile,
 * as corrald's config does, and changes requests as it documents (rewrite_plugin.c); its mask
 * hook restricts real generations, alone and together with a regex constraint; a callback that
 * fails rejects that request only; broken plugins (missing file, wrong ABI version, no entry
 * symbol, malformed table, bad settings) are refused with the path and the reason.
 *
 * The plugin paths come from CMake (SAMPLE_PLUGIN, BROKEN_ABI_PLUGIN, ...).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/generate.h"
#include "corral/model.h"
#include "corral/policy.h"
#include "corral/prompt.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static model *m;
static policy_vocab *vocab;

static void setup(void) {
    corral_error err;
    m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    vocab = policy_vocab_new(model_get_tokenizer(m), &err);
    ck_assert_msg(vocab != NULL, "%s", err.message);
}

static void teardown(void) {
    policy_vocab_destroy(&vocab);
    model_destroy(&m);
}

/* A profile: utf8 (reject), the sample plugin with the given settings, normalize_space. */
static policy_profile *sample_profile(const corral_policy_kv *kv, size_t n, corral_error *err) {
    const policy_step_desc steps[] = {
        {.kind = "utf8"},
        {.kind = "plugin", .path = SAMPLE_PLUGIN, .params = kv, .n_params = n},
        {.kind = "normalize_space"},
    };
    return policy_profile_new("with-plugin", steps, N_OF(steps), err);
}

static char *sanitize_ok(policy_profile *p, const char *in, sanitize_report *rep) {
    char *out;
    size_t n;
    corral_error err;
    ck_assert_msg(policy_sanitize(p, vocab, in, strlen(in), &out, &n, rep, &err) == CORRAL_OK, "%s",
                  err.message);
    ck_assert_uint_eq(strlen(out), n);
    return out;
}

START_TEST(test_sample_plugin_rewrites_requests) {
    const corral_policy_kv kv[] = {{"from", "cat"}, {"to", "dog"}, {"forbid", "password"}};
    corral_error err;
    policy_profile *p = sample_profile(kv, N_OF(kv), &err);
    ck_assert_msg(p != NULL, "%s", err.message);
    ck_assert_str_eq(policy_profile_step_name(p, 1), "rewrite"); /* the plugin's own name */
    sanitize_report rep;
    char *out = sanitize_ok(p, "The cat  sat on the cat mat", &rep);
    ck_assert_str_eq(out, "The dog sat on the dog mat");
    free(out);
    ck_assert_uint_eq(rep.n_steps, 3);
    ck_assert_str_eq(rep.steps[1].step, "rewrite");
    ck_assert_int_eq(rep.steps[1].verdict, SANITIZE_CHANGED);
    ck_assert_uint_eq(rep.steps[1].count, 2);
    ck_assert_str_eq(rep.steps[1].note, "rewrote 2 occurrences of 'cat'");
    ck_assert_int_eq(rep.steps[2].verdict, SANITIZE_CHANGED); /* the double space, after it */
    /* nothing to rewrite: passed, and the text is unchanged */
    out = sanitize_ok(p, "no felines here", &rep);
    ck_assert_str_eq(out, "no felines here");
    ck_assert_int_eq(rep.steps[1].verdict, SANITIZE_PASSED);
    free(out);
    /* the plugin's rejection names it and its reason... */
    char *o2 = NULL;
    size_t n2;
    const char *bad = "my password is hunter2";
    ck_assert_int_eq(policy_sanitize(p, vocab, bad, strlen(bad), &o2, &n2, &rep, &err),
                     CORRAL_SANITIZER_REJECTED);
    ck_assert_ptr_null(o2);
    ck_assert_str_eq(err.message,
                     "sanitizer 'rewrite' rejected the input: contains the forbidden word "
                     "'password'");
    ck_assert_int_eq(rep.steps[rep.n_steps - 1].verdict, SANITIZE_REJECTED);
    /* ...a failing callback fails that request with its status... */
    const char *fail = "please PLUGIN-FAIL now";
    ck_assert_int_eq(policy_sanitize(p, vocab, fail, strlen(fail), &o2, &n2, NULL, &err),
                     CORRAL_INTERNAL);
    ck_assert_str_eq(err.message, "sanitizer 'rewrite' failed: asked to fail");
    /* ...and the next request is served as before. */
    out = sanitize_ok(p, "cat", NULL);
    ck_assert_str_eq(out, "dog");
    free(out);
    /* Steps run in order: a rewrite can make text the later steps see. */
    const corral_policy_kv kv2[] = {{"from", "x"}, {"to", "  "}};
    policy_profile *p2 = sample_profile(kv2, N_OF(kv2), &err);
    out = sanitize_ok(p2, "axxb", NULL);
    ck_assert_str_eq(out, "a b");
    free(out);
    policy_profile_destroy(&p2);
    policy_profile_destroy(&p);
}
END_TEST

/* Generate from "Once upon a time" with policy_gen's processor; returns the text. */
static void generate(policy_gen *pg, uint64_t seed, char *out, size_t cap, gen_stop *stop) {
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 128, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    gen_params gp = gen_params_default();
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = 0;
    gp.sampling.top_p = 1.0f;
    gp.sampling.min_p = 0.0f;
    gp.sampling.seed = seed;
    gp.max_tokens = 40;
    gp.processor = policy_gen_processor(pg);
    generator *g = gen_new(m, r, kv, &gp, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(
        prompt_tokenize_text(model_get_tokenizer(m), "Once upon a time", 16, &ids, &n, &err),
        CORRAL_OK);
    ck_assert_int_eq(gen_prefill(g, ids, (uint32_t)n, &err), CORRAL_OK);
    free(ids);
    size_t len = 0;
    gen_token t;
    do {
        ck_assert_msg(gen_next(g, &t, &err) == CORRAL_OK, "%s", err.message);
        ck_assert_uint_lt(len + t.len, cap);
        memcpy(out + len, t.text, t.len);
        len += t.len;
    } while (t.stop == GEN_STOP_NONE);
    out[len] = '\0';
    *stop = t.stop;
    gen_destroy(&g);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
}

START_TEST(test_plugin_mask_restricts_output) {
    const corral_policy_kv kv[] = {{"from", "a"}, {"to", "b"}, {"ban", "e"}};
    corral_error err;
    policy_profile *p = sample_profile(kv, N_OF(kv), &err);
    ck_assert_msg(p != NULL, "%s", err.message);
    char text[4096];
    gen_stop stop;
    int e_without = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        /* without the profile the model writes plenty of e's... */
        policy_gen *none = policy_gen_new(NULL, vocab, NULL, 0, &err);
        ck_assert_ptr_nonnull(none);
        ck_assert_ptr_null(policy_gen_processor(none)); /* nothing restricts the output */
        generate(none, seed, text, sizeof text, &stop);
        e_without += strchr(text, 'e') != NULL;
        policy_gen_destroy(&none);
        /* ...with it, none */
        policy_gen *pg = policy_gen_new(p, vocab, NULL, 0, &err);
        ck_assert_msg(pg != NULL, "%s", err.message);
        ck_assert_ptr_nonnull(policy_gen_processor(pg));
        generate(pg, seed, text, sizeof text, &stop);
        ck_assert_msg(strchr(text, 'e') == NULL, "seed %llu: \"%s\"", (unsigned long long)seed,
                      text);
        ck_assert_uint_gt(strlen(text), 0);
        policy_gen_destroy(&pg);
        /* with a request regex as well: both hold */
        const char *re = "[a-z ]{5,30}\\.";
        pg = policy_gen_new(p, vocab, re, strlen(re), &err);
        ck_assert_msg(pg != NULL, "%s", err.message);
        generate(pg, seed, text, sizeof text, &stop);
        ck_assert_msg(strchr(text, 'e') == NULL, "\"%s\"", text);
        ck_assert_int_eq(stop, GEN_STOP_CONSTRAINT);
        const size_t n = strlen(text);
        ck_assert_msg(n >= 6 && n <= 31 && text[n - 1] == '.', "\"%s\"", text);
        for (size_t i = 0; i + 1 < n; i++)
            ck_assert_msg((text[i] >= 'a' && text[i] <= 'z') || text[i] == ' ', "\"%s\"", text);
        policy_gen_destroy(&pg);
    }
    ck_assert_int_ge(e_without, 5);
    /* a bad request regex is the request's error, named */
    ck_assert_ptr_null(policy_gen_new(p, vocab, "(?=x)", 5, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "lookahead"));
    policy_profile_destroy(&p);
}
END_TEST

/* The built-in regex policy in a profile constrains every generation under it. */
START_TEST(test_profile_regex_builtin) {
    const corral_policy_kv kv[] = {{"pattern", "(yes|no)"}};
    const policy_step_desc step = {.kind = "regex", .params = kv, .n_params = 1};
    corral_error err;
    policy_profile *p = policy_profile_new("answers", &step, 1, &err);
    ck_assert_msg(p != NULL, "%s", err.message);
    char text[256];
    gen_stop stop;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        policy_gen *pg = policy_gen_new(p, vocab, NULL, 0, &err);
        generate(pg, seed, text, sizeof text, &stop);
        ck_assert_msg(!strcmp(text, "yes") || !strcmp(text, "no"), "\"%s\"", text);
        policy_gen_destroy(&pg);
    }
    /* the profile's sanitize pass has nothing to do (regex has no sanitize callback) */
    sanitize_report rep;
    char *out = sanitize_ok(p, "x", &rep);
    ck_assert_uint_eq(rep.n_steps, 0);
    free(out);
    policy_profile_destroy(&p);
}
END_TEST

START_TEST(test_broken_plugins_refused) {
    static const struct {
        const char *path, *says;
        corral_status status;
    } cases[] = {
        {"/nonexistent/corral-plugin.so", "cannot load: /nonexistent/corral-plugin.so", CORRAL_IO},
        {BROKEN_ABI_PLUGIN, "built for policy ABI version 99; this corral supports version 1",
         CORRAL_UNSUPPORTED},
        {BROKEN_NO_ENTRY_PLUGIN, "no corral_policy_v1_entry symbol", CORRAL_NOT_FOUND},
        {BROKEN_TABLE_PLUGIN, "gen_allowed and gen_mask must come together", CORRAL_FORMAT},
        {"/etc/hostname", "cannot load", CORRAL_IO},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        corral_error err;
        ck_assert_ptr_null(policy_plugin_load(cases[i].path, &err));
        ck_assert_msg(err.status == cases[i].status, "%s: %s", cases[i].path, err.message);
        ck_assert_msg(strstr(err.message, cases[i].says) != NULL, "\"%s\" lacks \"%s\"",
                      err.message, cases[i].says);
        ck_assert_ptr_nonnull(strstr(err.message, cases[i].path)); /* the path is named */
        /* through a profile, as at startup: the profile and step are named too */
        const policy_step_desc step = {.kind = "plugin", .path = cases[i].path};
        ck_assert_ptr_null(policy_profile_new("strict", &step, 1, &err));
        ck_assert_int_eq(err.status, cases[i].status);
        ck_assert_ptr_nonnull(strstr(err.message, "profile 'strict', step 1: plugin "));
        ck_assert_ptr_nonnull(strstr(err.message, cases[i].says));
    }
    /* a good plugin with bad settings: its own message */
    corral_error err;
    const corral_policy_kv kv[] = {{"to", "x"}};
    ck_assert_ptr_null(sample_profile(kv, 1, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_str_eq(err.message, "profile 'with-plugin', step 2 (rewrite): rewrite: 'from' "
                                  "(non-empty) and 'to' are required");
    /* loading directly */
    policy_plugin *pl = policy_plugin_load(SAMPLE_PLUGIN, &err);
    ck_assert_msg(pl != NULL, "%s", err.message);
    ck_assert_str_eq(policy_plugin_table(pl)->name, "rewrite");
    ck_assert_uint_eq(policy_plugin_table(pl)->abi_version, CORRAL_POLICY_ABI_VERSION);
    policy_plugin_destroy(&pl);
    ck_assert_ptr_null(pl);
    policy_plugin_destroy(NULL);
    ck_assert_ptr_null(policy_plugin_load(NULL, &err));
    ck_assert_ptr_null(policy_plugin_table(NULL));
}
END_TEST

/* The host services a plugin sees. */
START_TEST(test_host_services) {
    const corral_policy_host *h = policy_vocab_host(vocab);
    const tokenizer *t = model_get_tokenizer(m);
    ck_assert_uint_eq(h->struct_size, sizeof(corral_policy_host));
    ck_assert_int_eq(h->n_vocab, tok_vocab_size(t));
    const char *b;
    size_t n;
    ck_assert_int_eq(h->token_bytes(h->ctx, tok_eos(t), &b, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(h->token_kind(h->ctx, tok_eos(t)), CORRAL_POLICY_TOKEN_EOG);
    ck_assert_int_eq(h->token_kind(h->ctx, tok_bos(t)), CORRAL_POLICY_TOKEN_CONTROL);
    ck_assert_int_eq(h->token_kind(h->ctx, -1), -1);
    ck_assert_int_eq(h->token_bytes(h->ctx, h->n_vocab, &b, &n), CORRAL_POLICY_INVALID_ARGUMENT);
    /* every token's bytes are what the decoder gives */
    for (int32_t id = 0; id < h->n_vocab; id++) {
        char want[64];
        size_t wn;
        ck_assert_int_eq(tok_decode_piece(t, id, 0, want, sizeof want, &wn, NULL), CORRAL_OK);
        ck_assert_int_eq(h->token_bytes(h->ctx, id, &b, &n), 0);
        ck_assert(n == wn && memcmp(b, want, n) == 0);
    }
    size_t want_tokens = 0;
    tok_encode(t, "Once upon a time", 16, 0, NULL, 0, &want_tokens, NULL);
    ck_assert_int_eq(h->count_tokens(h->ctx, "Once upon a time", 16), (int64_t)want_tokens);
    ck_assert_uint_eq(h->special_prefix(h->ctx, "</s>x", 5), 4);
    ck_assert_uint_eq(h->special_prefix(h->ctx, "x</s>", 5), 0);
    ck_assert_uint_eq(h->special_prefix(h->ctx, "</s", 3), 0);
}
END_TEST

static Suite *policy_plugin_suite(void) {
    Suite *s = suite_create("policy_plugin");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_sample_plugin_rewrites_requests);
    tcase_add_test(core, test_plugin_mask_restricts_output);
    tcase_add_test(core, test_profile_regex_builtin);
    tcase_add_test(core, test_host_services);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_broken_plugins_refused);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(policy_plugin_suite)
