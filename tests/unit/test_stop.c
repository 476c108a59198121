/*
 * test_stop.c — Check suite for the streaming stop-string matcher (engine/include/corral/stop.h).
 *
 * Every test feeds pieces and rebuilds the emitted text the way a caller would (held part, then
 * the front of the piece); expectations are written by hand. A brute-force reference (the text up
 * to the earliest occurrence of any stop string) checks every split of a set of strings.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "corral/stop.h"
#include "testutil.h"

typedef struct sink {
    char text[4096];
    size_t len;
    bool stopped;
} sink;

static void sink_take(sink *k, const stop_result *r, const char *piece) {
    ck_assert_uint_le(k->len + r->held_len + r->piece_len, sizeof k->text - 1);
    memcpy(k->text + k->len, r->held, r->held_len);
    k->len += r->held_len;
    memcpy(k->text + k->len, piece, r->piece_len);
    k->len += r->piece_len;
    k->text[k->len] = '\0';
    k->stopped = r->stopped;
}

/* Feed each piece; returns how many bytes were emitted by the last feed. */
static size_t feed(stop_matcher *m, sink *k, const char *piece) {
    stop_result r;
    ck_assert_int_eq(stop_feed(m, piece, strlen(piece), &r), CORRAL_OK);
    sink_take(k, &r, piece);
    return r.held_len + r.piece_len;
}

static void finish(stop_matcher *m, sink *k) {
    stop_result r;
    ck_assert_int_eq(stop_finish(m, &r), CORRAL_OK);
    ck_assert_uint_eq(r.piece_len, 0);
    sink_take(k, &r, "");
}

static stop_matcher *make(const char *const *stops, size_t n) {
    corral_error err;
    stop_matcher *m = stop_matcher_new(stops, n, &err);
    ck_assert_msg(m != NULL, "stop_matcher_new: %s", err.message);
    return m;
}

/* ---- core ------------------------------------------------------------------------------------ */

START_TEST(test_match_split_across_pieces) {
    const char *stops[] = {"\nUser:"};
    stop_matcher *m = make(stops, 1);
    sink k = {0};
    ck_assert_uint_eq(feed(m, &k, "Hello"), 5);
    ck_assert_uint_eq(feed(m, &k, " there\n"), 6); /* "\n" is held */
    ck_assert_str_eq(k.text, "Hello there");
    ck_assert_uint_eq(feed(m, &k, "Us"), 0);
    ck_assert(!k.stopped);
    feed(m, &k, "er: more");
    ck_assert(k.stopped);
    ck_assert_str_eq(k.text, "Hello there");
    /* after the stop nothing more comes out */
    ck_assert_uint_eq(feed(m, &k, "tail"), 0);
    ck_assert(k.stopped);
    finish(m, &k);
    ck_assert_str_eq(k.text, "Hello there");
    stop_matcher_destroy(&m);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(test_overlapping_candidates) {
    const char *stops[] = {"abc", "ab"};
    stop_matcher *m = make(stops, 2);
    sink k = {0};
    feed(m, &k, "xa");
    ck_assert_str_eq(k.text, "x");
    feed(m, &k, "b");
    ck_assert(k.stopped);
    ck_assert_str_eq(k.text, "x");
    stop_matcher_destroy(&m);

    /* "abc" held as a prefix, then "bd" completes inside it: emit up to "bd". */
    const char *stops2[] = {"abc", "bd"};
    m = make(stops2, 2);
    sink k2 = {0};
    feed(m, &k2, "ab");
    ck_assert_str_eq(k2.text, "");
    feed(m, &k2, "d!");
    ck_assert(k2.stopped);
    ck_assert_str_eq(k2.text, "a");
    stop_matcher_destroy(&m);

    /* A stop string inside another's prefix: "b" completes while "abc" is still a prefix, so
     * the output ends before "b"; when both complete in the same piece, "abc" starts first. */
    const char *stops3[] = {"abc", "b"};
    m = make(stops3, 2);
    sink k3 = {0};
    feed(m, &k3, "za");
    feed(m, &k3, "b");
    ck_assert(k3.stopped);
    ck_assert_str_eq(k3.text, "za");
    stop_reset(m);
    sink k4 = {0};
    feed(m, &k4, "za");
    feed(m, &k4, "bc");
    ck_assert(k4.stopped);
    ck_assert_str_eq(k4.text, "z");
    stop_matcher_destroy(&m);
}
END_TEST

START_TEST(test_stop_at_very_start) {
    const char *stops[] = {"</s>"};
    stop_matcher *m = make(stops, 1);
    sink k = {0};
    feed(m, &k, "</s>after");
    ck_assert(k.stopped);
    ck_assert_uint_eq(k.len, 0);
    stop_matcher_destroy(&m);

    m = make(stops, 1);
    sink k2 = {0};
    feed(m, &k2, "<");
    feed(m, &k2, "/");
    feed(m, &k2, "s");
    ck_assert_uint_eq(k2.len, 0);
    feed(m, &k2, ">");
    ck_assert(k2.stopped);
    ck_assert_uint_eq(k2.len, 0);
    stop_matcher_destroy(&m);
}
END_TEST

START_TEST(test_held_text_released_at_finish) {
    const char *stops[] = {"STOP"};
    stop_matcher *m = make(stops, 1);
    sink k = {0};
    feed(m, &k, "the end ST");
    ck_assert_str_eq(k.text, "the end ");
    finish(m, &k);
    ck_assert(!k.stopped);
    ck_assert_str_eq(k.text, "the end ST");
    /* finish empties the hold: a second finish adds nothing */
    finish(m, &k);
    ck_assert_str_eq(k.text, "the end ST");
    stop_matcher_destroy(&m);
}
END_TEST

START_TEST(test_prefix_then_diverges) {
    const char *stops[] = {"<|im_end|>"};
    stop_matcher *m = make(stops, 1);
    sink k = {0};
    feed(m, &k, "a <|im");
    ck_assert_str_eq(k.text, "a ");
    feed(m, &k, "_sta");
    ck_assert_str_eq(k.text, "a <|im_sta"); /* diverged: everything released */
    feed(m, &k, "rt|> <|");
    ck_assert_str_eq(k.text, "a <|im_start|> ");
    feed(m, &k, "<|im_end|>x");
    ck_assert(k.stopped);
    ck_assert_str_eq(k.text, "a <|im_start|> <|");
    stop_matcher_destroy(&m);

    /* A new prefix starting inside the held one: stop "aab" over "aaab" holds "aa", emits "a". */
    const char *stops2[] = {"aab"};
    m = make(stops2, 1);
    sink k2 = {0};
    feed(m, &k2, "aa");
    ck_assert_str_eq(k2.text, "");
    feed(m, &k2, "a");
    ck_assert_str_eq(k2.text, "a"); /* "aa" may still become "aab" */
    feed(m, &k2, "b");
    ck_assert(k2.stopped);
    ck_assert_str_eq(k2.text, "a");
    stop_matcher_destroy(&m);
}
END_TEST

START_TEST(test_empty_stop_list) {
    stop_matcher *m = make(NULL, 0);
    sink k = {0};
    ck_assert_uint_eq(feed(m, &k, "anything at all"), 15);
    ck_assert_uint_eq(feed(m, &k, ""), 0);
    finish(m, &k);
    ck_assert_str_eq(k.text, "anything at all");
    ck_assert(!k.stopped);
    stop_matcher_destroy(&m);
}
END_TEST

START_TEST(test_reset_reuses_matcher) {
    const char *stops[] = {"##"};
    stop_matcher *m = make(stops, 1);
    sink k = {0};
    feed(m, &k, "x##");
    ck_assert(k.stopped);
    stop_reset(m);
    sink k2 = {0};
    feed(m, &k2, "y#");
    ck_assert(!k2.stopped);
    ck_assert_str_eq(k2.text, "y");
    stop_reset(m); /* the held "#" is forgotten too */
    sink k3 = {0};
    feed(m, &k3, "#z");
    ck_assert_str_eq(k3.text, "#z");
    stop_matcher_destroy(&m);
}
END_TEST

/* The text up to the earliest occurrence of any stop string (or all of it). */
static size_t reference_cut(const char *text, const char *const *stops, size_t n, bool *stopped) {
    size_t len = strlen(text);
    for (size_t pos = 0; pos < len; pos++) {
        for (size_t j = 0; j < n; j++) {
            if (strncmp(text + pos, stops[j], strlen(stops[j])) == 0) {
                *stopped = true;
                return pos;
            }
        }
    }
    *stopped = false;
    return len;
}

START_TEST(test_every_split_matches_reference) {
    const char *stops[] = {"abab", "bac", "c\n", "xyzzy"};
    const char *texts[] = {"aababac", "ababbac", "abacab",       "xyzzxyzzy", "q c c\n",
                           "abaabab", "bababa",  "no stop here", "xyzzyabab"};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        const char *text = texts[t];
        size_t len = strlen(text);
        bool want_stop;
        size_t want_len = reference_cut(text, stops, 4, &want_stop);
        /* every way of cutting the text into pieces: bit i of `cuts` cuts after byte i */
        for (unsigned cuts = 0; cuts < (1u << (len - 1)); cuts++) {
            stop_matcher *m = make(stops, 4);
            sink k = {0};
            size_t start = 0;
            for (size_t i = 1; i <= len; i++) {
                if (i == len || (cuts >> (i - 1)) & 1u) {
                    char piece[32];
                    memcpy(piece, text + start, i - start);
                    piece[i - start] = '\0';
                    feed(m, &k, piece);
                    start = i;
                }
            }
            finish(m, &k);
            ck_assert_msg(
                k.stopped == want_stop && k.len == want_len && memcmp(k.text, text, want_len) == 0,
                "text '%s' cuts %#x: got '%s' stopped %d", text, cuts, k.text, (int)k.stopped);
            stop_matcher_destroy(&m);
        }
    }
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

START_TEST(test_longest_stop_string_and_long_piece) {
    char longest[STOP_MAX_LEN + 1];
    memset(longest, 'z', STOP_MAX_LEN);
    longest[STOP_MAX_LEN] = '\0';
    const char *stops[] = {longest};
    stop_matcher *m = make(stops, 1);
    /* 255 'z' are held (a proper prefix), one more completes the match */
    static char piece[1000 + STOP_MAX_LEN];
    memset(piece, 'a', 1000);
    memset(piece + 1000, 'z', STOP_MAX_LEN - 1);
    piece[1000 + STOP_MAX_LEN - 1] = '\0';
    stop_result r;
    ck_assert_int_eq(stop_feed(m, piece, strlen(piece), &r), CORRAL_OK);
    ck_assert_uint_eq(r.held_len + r.piece_len, 1000);
    ck_assert(!r.stopped);
    ck_assert_int_eq(stop_feed(m, "zzz", 3, &r), CORRAL_OK);
    ck_assert(r.stopped);
    ck_assert_uint_eq(r.held_len + r.piece_len, 0);
    stop_matcher_destroy(&m);

    /* the maximum number of strings */
    const char *many[STOP_MAX_STRINGS];
    char bufs[STOP_MAX_STRINGS][8];
    for (int i = 0; i < STOP_MAX_STRINGS; i++) {
        snprintf(bufs[i], sizeof bufs[i], "<%d>", i);
        many[i] = bufs[i];
    }
    m = make(many, STOP_MAX_STRINGS);
    sink k = {0};
    feed(m, &k, "a<1");
    feed(m, &k, "5>b");
    ck_assert(k.stopped);
    ck_assert_str_eq(k.text, "a");
    stop_matcher_destroy(&m);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

START_TEST(test_limit_errors) {
    corral_error err;
    const char *many[STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= STOP_MAX_STRINGS; i++) many[i] = "x";
    ck_assert_ptr_null(stop_matcher_new(many, STOP_MAX_STRINGS + 1, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "too many"));

    char too_long[STOP_MAX_LEN + 2];
    memset(too_long, 'y', STOP_MAX_LEN + 1);
    too_long[STOP_MAX_LEN + 1] = '\0';
    const char *bad_len[] = {"ok", too_long};
    ck_assert_ptr_null(stop_matcher_new(bad_len, 2, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "stop string 1"));

    const char *empty[] = {"ok", ""};
    ck_assert_ptr_null(stop_matcher_new(empty, 2, &err));
    ck_assert_ptr_nonnull(strstr(err.message, "stop string 1 is empty"));
    const char *null_str[] = {NULL};
    ck_assert_ptr_null(stop_matcher_new(null_str, 1, &err));
    ck_assert_ptr_null(stop_matcher_new(NULL, 1, &err));
}
END_TEST

START_TEST(test_bad_arguments) {
    const char *stops[] = {"x"};
    stop_matcher *m = make(stops, 1);
    stop_result r;
    ck_assert_int_eq(stop_feed(m, NULL, 3, &r), CORRAL_INVALID_ARGUMENT);
    ck_assert_uint_eq(r.held_len + r.piece_len, 0);
    ck_assert_int_eq(stop_feed(m, NULL, 0, &r), CORRAL_OK);
    ck_assert_int_eq(stop_feed(NULL, "a", 1, &r), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(stop_feed(m, "a", 1, NULL), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(stop_finish(NULL, &r), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(stop_finish(m, NULL), CORRAL_INVALID_ARGUMENT);
    stop_matcher_destroy(&m);
    stop_matcher_destroy(&m);
    stop_matcher_destroy(NULL);
    stop_reset(NULL);
}
END_TEST

static Suite *stop_suite(void) {
    Suite *s = suite_create("stop");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_match_split_across_pieces);
    tcase_add_test(core, test_overlapping_candidates);
    tcase_add_test(core, test_stop_at_very_start);
    tcase_add_test(core, test_held_text_released_at_finish);
    tcase_add_test(core, test_prefix_then_diverges);
    tcase_add_test(core, test_empty_stop_list);
    tcase_add_test(core, test_reset_reuses_matcher);
    tcase_add_test(core, test_every_split_matches_reference);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_longest_stop_string_and_long_piece);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_limit_errors);
    tcase_add_test(errors, test_bad_arguments);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(stop_suite)
