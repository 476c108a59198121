/*
 * test_budget.c — Check suite for the memory budget (daemon/budget.c) with fake holders: the
 * watermarks, the eviction order, what is never evicted, evictions in flight, and the messages.
 */
#include <check.h>
#include <string.h>

#include "budget.h"
#include "testutil.h"

#define MIB (1024ull * 1024ull)

static budget_params params(uint64_t limit_mib, const char *policy) {
    return (budget_params){
        .limit = limit_mib * MIB, .high = 0.85, .low = 0.70, .policy = evict_policy_find(policy)};
}

static budget_holder model(const char *name, uint64_t mib, int64_t last_used_ms, uint32_t flags) {
    return (budget_holder){.c = {.kind = EVICT_KIND_MODEL,
                                 .last_used_ms = last_used_ms,
                                 .bytes = mib * MIB,
                                 .reload_bytes = mib * MIB},
                           .name = name,
                           .flags = flags};
}

static budget_holder session(const char *name, uint64_t mib, int64_t last_used_ms, uint32_t flags) {
    budget_holder h = model(name, mib, last_used_ms, flags | BUDGET_ASYNC);
    h.c.kind = EVICT_KIND_SESSION;
    return h;
}

static uint64_t sum(const budget_holder *h, size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += h[i].c.bytes;
    return t;
}

START_TEST(test_under_the_high_watermark_nothing_is_evicted) {
    budget_params p = params(1000, "lru");
    budget_holder h[] = {model("a", 400, 0, 0), model("b", 400, 1, 0)};
    size_t v[2], nv = 9;
    /* 800 + 50 = 850 MiB: exactly the high watermark. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 2), 50 * MIB, h, 2, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 0);
}
END_TEST

START_TEST(test_eviction_goes_down_to_the_low_watermark_in_lru_order) {
    budget_params p = params(1000, "lru");
    /* 4 models of 200 MiB, used at times 40, 10, 30, 20: total 800. Asking for 150 more crosses
     * the high watermark (850); eviction must bring 800 - x + 150 under 700: two models go, the
     * least recently used first (b at 10, then d at 20), and nothing more. */
    budget_holder h[] = {model("a", 200, 40, 0), model("b", 200, 10, 0), model("c", 200, 30, 0),
                         model("d", 200, 20, 0)};
    size_t v[4], nv;
    ck_assert_int_eq(budget_plan(&p, sum(h, 4), 150 * MIB, h, 4, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 2);
    ck_assert_uint_eq(v[0], 1);
    ck_assert_uint_eq(v[1], 3);
}
END_TEST

START_TEST(test_pinned_and_busy_holders_are_never_chosen) {
    budget_params p = params(1000, "lru");
    budget_holder h[] = {model("pinned", 300, 0, BUDGET_PINNED),
                         model("busy", 300, 1, BUDGET_IN_USE), model("idle", 300, 500, 0)};
    size_t v[3], nv;
    /* 900 + 50: only "idle" may go, though it is the most recently used. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 50 * MIB, h, 3, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(v[0], 2);
    /* Asking for 450: 600 held by the untouchable two, +450 is over the limit: FULL. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 450 * MIB, h, 3, 1000, v, &nv), BUDGET_FULL);
    ck_assert_uint_eq(nv, 1);
}
END_TEST

START_TEST(test_kept_parts_go_last_oldest_first) {
    budget_params p = params(100, "lru");
    /* Kept parts are older than the session, yet the session goes first; then the kept parts,
     * oldest first. (The busy model may end its requests: a wait, not a NEVER.) */
    budget_holder h[] = {model("k1", 10, 5, BUDGET_KEPT), model("k2", 10, 1, BUDGET_KEPT),
                         session("s", 10, 50, 0), model("busy", 60, 0, BUDGET_IN_USE)};
    size_t v[4], nv;
    /* 90 held + 45 needed: all 30 evictable MiB go (the target is the low watermark, 70) and
     * 60 + 45 is still over the limit. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 4), 45 * MIB, h, 4, 1000, v, &nv), BUDGET_FULL);
    ck_assert_uint_eq(nv, 3);
    ck_assert_uint_eq(v[0], 2);
    ck_assert_uint_eq(v[1], 1);
    ck_assert_uint_eq(v[2], 0);
    /* Asking for 10: 90 - 10 (session) + 10 = 90 is above the low watermark, so k2 and k1 go as
     * well; it fits at once only when the immediate victims suffice (the session's write is
     * asynchronous): 90 - 20 + 10 = 80 <= 100. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 4), 10 * MIB, h, 4, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 3);
}
END_TEST

/* What nothing will ever give back — pinned holders, the holder the room is for — plus the
 * request over the limit: NEVER at once, with no victims, instead of FULL and a wait for nothing
 * (issue 20, finding 4). Busy holders alone keep it FULL: their requests end. */
START_TEST(test_what_stays_held_makes_a_request_that_can_never_fit) {
    budget_params p = params(100, "lru");
    budget_holder h[] = {model("pinned", 40, 0, BUDGET_PINNED), model("idle", 20, 5, 0),
                         model("target", 30, 9, BUDGET_IN_USE | BUDGET_TARGET)};
    size_t v[3], nv = 7;
    ck_assert_uint_eq(budget_fixed_bytes(h, 3), 70 * MIB);
    /* 70 stay held: 31 more can never fit, though 31 < 100 and 20 could be evicted. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 31 * MIB, h, 3, 1000, v, &nv), BUDGET_NEVER);
    ck_assert_uint_eq(nv, 0);
    /* 30 fit once the idle model goes. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 30 * MIB, h, 3, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(v[0], 1);
    /* The same holders merely busy: the request waits for them (FULL), never NEVER. */
    h[0].flags = BUDGET_IN_USE;
    h[2].flags = BUDGET_IN_USE;
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 31 * MIB, h, 3, 1000, v, &nv), BUDGET_FULL);
    /* More than the whole limit: NEVER whatever is held. */
    ck_assert_int_eq(budget_plan(&p, 0, 101 * MIB, NULL, 0, 1000, v, &nv), BUDGET_NEVER);
}
END_TEST

START_TEST(test_asynchronous_evictions_make_the_request_wait) {
    budget_params p = params(100, "lru");
    budget_holder h[] = {session("s1", 30, 1, 0), session("s2", 30, 2, 0),
                         model("busy", 30, 3, BUDGET_IN_USE)};
    size_t v[3], nv;
    /* 90 + 20 = 110 > 100: only the sessions can go, and only once written. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 20 * MIB, h, 3, 1000, v, &nv), BUDGET_WAIT);
    ck_assert_uint_eq(nv, 2);
    /* The writes in flight: nothing more to choose, still WAIT (they will free enough). */
    h[0].flags |= BUDGET_LEAVING;
    h[1].flags |= BUDGET_LEAVING;
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 20 * MIB, h, 3, 1000, v, &nv), BUDGET_WAIT);
    ck_assert_uint_eq(nv, 0);
    /* One written and freed: 60 + 20 fits. */
    ck_assert_int_eq(budget_plan(&p, sum(h + 1, 2), 20 * MIB, h + 1, 2, 1000, v, &nv), BUDGET_FITS);
}
END_TEST

START_TEST(test_lru_cost_prefers_what_returns_cheaply) {
    /* Equally idle, 800 held, 100 asked: one victim brings the total under the low watermark.
     * lru takes the first of the tie (the big model); lru-cost the small cache, which comes back
     * cheaply. */
    budget_holder h[] = {model("big", 500, 0, 0), session("small", 300, 0, 0)};
    size_t v[2], nv;
    budget_params p = params(1000, "lru");
    ck_assert_int_eq(budget_plan(&p, sum(h, 2), 100 * MIB, h, 2, 60000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(v[0], 0);
    p = params(1000, "lru-cost");
    ck_assert_int_eq(budget_plan(&p, sum(h, 2), 100 * MIB, h, 2, 60000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(v[0], 1);
}
END_TEST

START_TEST(test_more_than_the_limit_is_never) {
    budget_params p = params(100, "lru");
    size_t v[1], nv = 7;
    ck_assert_int_eq(budget_plan(&p, 0, 101 * MIB, NULL, 0, 0, v, &nv), BUDGET_NEVER);
    ck_assert_uint_eq(nv, 0);
    ck_assert_int_eq(budget_plan(&p, 0, 100 * MIB, NULL, 0, 0, v, &nv), BUDGET_FITS);
}
END_TEST

START_TEST(test_a_request_larger_than_the_low_watermark_evicts_only_what_it_needs) {
    budget_params p = params(1000, "lru");
    budget_holder h[] = {model("a", 100, 1, 0), model("b", 100, 2, 0), model("c", 100, 3, 0)};
    size_t v[3], nv;
    /* 800 MiB asked (> low 700): the target is the limit, so 300 + 800 needs 100 freed: only a. */
    ck_assert_int_eq(budget_plan(&p, sum(h, 3), 800 * MIB, h, 3, 1000, v, &nv), BUDGET_FITS);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(v[0], 0);
}
END_TEST

START_TEST(test_describe_names_every_holder) {
    budget_params p = params(100, "lru");
    budget_holder h[] = {model("stories", 10, 0, BUDGET_PINNED),
                         model("tiny", 20, 0, BUDGET_IN_USE), model("old", 1, 0, BUDGET_KEPT),
                         session("chat-1", 5, 0, BUDGET_LEAVING), model("empty", 0, 0, 0)};
    char msg[512];
    budget_describe(&p, h, 5, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "memory limit 100.0 MiB is held by:") == msg, "%s", msg);
    ck_assert_msg(strstr(msg, "model 'stories' 10.0 MiB (pinned)"), "%s", msg);
    ck_assert_msg(strstr(msg, "model 'tiny' 20.0 MiB (requests running)"), "%s", msg);
    ck_assert_msg(strstr(msg, "(swapped out, tokenizer and scratch kept)"), "%s", msg);
    ck_assert_msg(strstr(msg, "session 'chat-1' 5.0 MiB (being written"), "%s", msg);
    ck_assert_msg(!strstr(msg, "empty"), "%s", msg);
    budget_describe(&p, NULL, 0, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "nothing evictable"), "%s", msg);
    /* A small buffer is cut, never overrun. */
    char tiny[16];
    budget_describe(&p, h, 5, tiny, sizeof tiny);
    ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);
}
END_TEST

static Suite *budget_suite(void) {
    Suite *s = suite_create("budget");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_under_the_high_watermark_nothing_is_evicted);
    tcase_add_test(core, test_eviction_goes_down_to_the_low_watermark_in_lru_order);
    tcase_add_test(core, test_pinned_and_busy_holders_are_never_chosen);
    tcase_add_test(core, test_what_stays_held_makes_a_request_that_can_never_fit);
    tcase_add_test(core, test_kept_parts_go_last_oldest_first);
    tcase_add_test(core, test_asynchronous_evictions_make_the_request_wait);
    tcase_add_test(core, test_lru_cost_prefers_what_returns_cheaply);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_more_than_the_limit_is_never);
    tcase_add_test(limits, test_a_request_larger_than_the_low_watermark_evicts_only_what_it_needs);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_describe_names_every_holder);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(budget_suite)
