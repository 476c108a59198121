/*
 * test_evict.c — Check suite for the eviction policies: the orders they give, names, ties.
 */
#include <check.h>
#include <string.h>

#include "corral/evict.h"
#include "testutil.h"

START_TEST(test_lru_takes_the_least_recently_used) {
    const evict_policy *p = evict_policy_find("lru");
    ck_assert_ptr_nonnull(p);
    evict_candidate c[3] = {{.last_used_ms = 900, .bytes = 1},
                            {.last_used_ms = 100, .bytes = 1},
                            {.last_used_ms = 500, .bytes = 1000}};
    ck_assert_int_eq(evict_pick(p, c, 3, 1000), 1);
    c[1].last_used_ms = 950;
    ck_assert_int_eq(evict_pick(p, c, 3, 1000), 2);
}
END_TEST

START_TEST(test_lru_cost_keeps_what_is_expensive_to_bring_back) {
    const evict_policy *p = evict_policy_find("lru-cost");
    ck_assert_ptr_nonnull(p);
    /* Equally idle: the cheap one (a small cache) goes before the 4 GB model. */
    evict_candidate c[2] = {
        {.kind = EVICT_KIND_MODEL, .last_used_ms = 0, .reload_bytes = 4ull << 30},
        {.kind = EVICT_KIND_SESSION, .last_used_ms = 0, .reload_bytes = 1 << 20}};
    ck_assert_int_eq(evict_pick(p, c, 2, 60000), 1);
    /* Rebuild work counts like reading: a merged model that would need re-merging stays. */
    evict_candidate d[2] = {{.last_used_ms = 0, .rebuild_us = 10000000},
                            {.last_used_ms = 0, .reload_bytes = 1 << 20}};
    ck_assert_int_eq(evict_pick(p, d, 2, 60000), 1);
    /* But idleness still dominates: a much older expensive model goes first. */
    evict_candidate e[2] = {{.last_used_ms = 0, .reload_bytes = 500u << 20},
                            {.last_used_ms = 3590000, .reload_bytes = 1 << 20}};
    ck_assert_int_eq(evict_pick(p, e, 2, 3600000), 0);
}
END_TEST

START_TEST(test_limits) {
    const evict_policy *p = evict_policy_find("lru");
    ck_assert_int_eq(evict_pick(p, NULL, 0, 0), -1);
    /* Ties: the earlier candidate. Clocks that went backwards: idle 0, not negative. */
    evict_candidate c[2] = {{.last_used_ms = 5000}, {.last_used_ms = 5000}};
    ck_assert_int_eq(evict_pick(p, c, 2, 1000), 0);
}
END_TEST

START_TEST(test_unknown_names) {
    ck_assert_ptr_null(evict_policy_find("random"));
    ck_assert_ptr_null(evict_policy_find(NULL));
    ck_assert_ptr_null(evict_policy_find("LRU"));
    ck_assert_ptr_nonnull(strstr(evict_policy_names(), "lru-cost"));
}
END_TEST

static Suite *evict_suite(void) {
    Suite *s = suite_create("evict");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_lru_takes_the_least_recently_used);
    tcase_add_test(core, test_lru_cost_keeps_what_is_expensive_to_bring_back);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_unknown_names);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(evict_suite)
