/*
 * test_suggest.c — Check suite for "did you mean" (base/include/corral/suggest.h).
 *
 * core: the distance (insertions, deletions, substitutions, adjacent transpositions, case), the
 * closest candidate and the text appended. limits: the threshold (a third of the longer name, at
 * least 1), names at and past SUGGEST_NAME_MAX, a buffer too small for the hint. errors: nothing
 * close, no candidates, NULL and empty entries.
 */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "corral/suggest.h"
#include "testutil.h"

START_TEST(test_distance) {
    ck_assert_uint_eq(suggest_distance("chatml", "chatml"), 0);
    ck_assert_uint_eq(suggest_distance("chatm", "chatml"), 1);   /* deletion */
    ck_assert_uint_eq(suggest_distance("chattml", "chatml"), 1); /* insertion */
    ck_assert_uint_eq(suggest_distance("chatnl", "chatml"), 1);  /* substitution */
    ck_assert_uint_eq(suggest_distance("cahtml", "chatml"), 1);  /* transposition */
    ck_assert_uint_eq(suggest_distance("ChatML", "chatml"), 0);  /* ASCII case */
    ck_assert_uint_eq(suggest_distance("", "abc"), 3);
    ck_assert_uint_eq(suggest_distance("kitten", "sitting"), 3);
}
END_TEST

START_TEST(test_closest_and_hint) {
    const char *keys[] = {"limits.max_message_bytes", "limits.queue_per_model", "memory.limit"};
    ck_assert_str_eq(suggest_closest("limits.max_mesage_bytes", keys, 3), keys[0]);
    const char *templates[] = {"none", "chatml", "llama2", "llama3", "mistral-v1", "mistral-v3"};
    ck_assert_str_eq(suggest_closest("lama3", templates, 6), "llama3");
    /* Equals: the first listed wins. */
    ck_assert_str_eq(suggest_closest("mistral", templates, 6), "mistral-v1");
    char buf[96] = "unknown chat template 'chatm'";
    ck_assert_str_eq(suggest_append(buf, sizeof buf, "chatm", templates, 6),
                     "unknown chat template 'chatm' (did you mean 'chatml'?)");
}
END_TEST

START_TEST(test_threshold) {
    /* A third of the longer name, at least 1: "ab" may not become "xy", "abcdef" may lose 2. */
    const char *c[] = {"xy", "abcdxy"};
    ck_assert_ptr_null(suggest_closest("ab", c, 1));
    ck_assert_str_eq(suggest_closest("abcdef", c + 1, 1), "abcdxy");
    const char *one[] = {"ab"};
    ck_assert_str_eq(suggest_closest("xb", one, 1), "ab");
    ck_assert_ptr_null(suggest_closest("xy", one, 1));
}
END_TEST

START_TEST(test_long_names_and_small_buffers) {
    char long_name[SUGGEST_NAME_MAX + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    ck_assert_uint_eq(suggest_distance(long_name, "a"), SIZE_MAX);
    const char *c[] = {long_name};
    ck_assert_ptr_null(suggest_closest(long_name, c, 1));
    long_name[SUGGEST_NAME_MAX] = '\0'; /* exactly the most it compares */
    ck_assert_uint_eq(suggest_distance(long_name, long_name), 0);
    /* The hint goes only when it fits whole enough to read: snprintf cuts it, never overruns. */
    const char *t[] = {"chatml"};
    char small[12] = "x";
    suggest_append(small, sizeof small, "chatm", t, 1);
    ck_assert_uint_lt(strlen(small), sizeof small);
    char full[4] = "abc";
    ck_assert_str_eq(suggest_append(full, sizeof full, "chatm", t, 1), "abc");
}
END_TEST

START_TEST(test_nothing_to_suggest) {
    const char *c[] = {NULL, "", "stories"};
    ck_assert_ptr_null(suggest_closest("zzz", c, 3));
    ck_assert_ptr_null(suggest_closest("stories", c, 0));
    ck_assert_ptr_null(suggest_closest("", c, 3));
    ck_assert_ptr_null(suggest_closest(NULL, c, 3));
    char buf[32] = "unknown";
    ck_assert_str_eq(suggest_append(buf, sizeof buf, "zzz", c, 3), "unknown");
}
END_TEST

static Suite *suggest_suite(void) {
    Suite *s = suite_create("suggest");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_distance);
    tcase_add_test(core, test_closest_and_hint);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_threshold);
    tcase_add_test(limits, test_long_names_and_small_buffers);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_nothing_to_suggest);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(suggest_suite)
