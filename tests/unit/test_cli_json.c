/*
 * test_cli_json.c — the corral CLI's JSON writer (clients/cli/json.c): separators in nested
 * containers, string escaping (quotes, backslashes, control characters, invalid UTF-8 replaced by
 * U+FFFD, valid multi-byte UTF-8 kept), and numbers JSON cannot hold. Expected texts are written
 * out by hand from RFC 8259.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "testutil.h"

/* Run `write` against an in-memory stream and return what it wrote (static buffer). */
static const char *render(void (*write)(json_writer *)) {
    static char buf[4096];
    memset(buf, 0, sizeof buf);
    FILE *fp = fmemopen(buf, sizeof buf - 1, "w");
    ck_assert_ptr_nonnull(fp);
    json_writer w;
    json_writer_init(&w, fp);
    write(&w);
    fclose(fp);
    return buf;
}

static void write_nested(json_writer *w) {
    json_begin_object(w);
    json_key(w, "a");
    json_uint(w, 18446744073709551615ull);
    json_key(w, "b");
    json_begin_array(w);
    json_int(w, -3);
    json_bool(w, true);
    json_null(w);
    json_begin_object(w);
    json_end_object(w);
    json_begin_array(w);
    json_end_array(w);
    json_end_array(w);
    json_key(w, "c");
    json_string(w, NULL);
    json_end_object(w);
    json_finish(w);
}

START_TEST(test_nested_separators) {
    ck_assert_str_eq(render(write_nested), "{\"a\":18446744073709551615,\"b\":[-3,true,null,{},[]],"
                                           "\"c\":null}\n");
}
END_TEST

static void write_escapes(json_writer *w) {
    json_begin_array(w);
    json_string(w, "say \"hi\"\\ now");
    json_string(w, "tab\there\nnew\r\x01\x1f");
    json_string(w, "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80");
    json_end_array(w);
}

START_TEST(test_string_escapes) {
    ck_assert_str_eq(render(write_escapes),
                     "[\"say \\\"hi\\\"\\\\ now\",\"tab\\there\\nnew\\r\\u0001\\u001f\","
                     "\"caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80\"]");
}
END_TEST

static void write_bad_utf8(json_writer *w) {
    json_begin_array(w);
    json_string(w, "a\xff"
                   "b");                /* a byte that never starts UTF-8 */
    json_string(w, "\xc3");             /* truncated sequence at the end */
    json_string(w, "\xc0\xaf");         /* overlong "/" */
    json_string(w, "\xed\xa0\x80");     /* a UTF-16 surrogate */
    json_string(w, "\xf4\x90\x80\x80"); /* past U+10FFFF */
    json_string(w, "\xe2\x82"
                   "A"); /* a cut sequence: one U+FFFD per byte, not per maximal subpart */
    json_end_array(w);
}

START_TEST(test_invalid_utf8_becomes_replacement) {
    ck_assert_str_eq(render(write_bad_utf8),
                     "[\"a\\ufffdb\",\"\\ufffd\",\"\\ufffd\\ufffd\",\"\\ufffd\\ufffd\\ufffd\","
                     "\"\\ufffd\\ufffd\\ufffd\\ufffd\",\"\\ufffd\\ufffdA\"]");
}
END_TEST

static void write_doubles(json_writer *w) {
    json_begin_array(w);
    json_double(w, 0.5);
    json_double(w, NAN);
    json_double(w, INFINITY);
    json_end_array(w);
}

START_TEST(test_doubles_json_cannot_hold_are_null) {
    ck_assert_str_eq(render(write_doubles), "[0.5,null,null]");
}
END_TEST

static Suite *cli_json_suite(void) {
    Suite *s = suite_create("cli_json");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_nested_separators);
    tcase_add_test(core, test_string_escapes);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_invalid_utf8_becomes_replacement);
    tcase_add_test(errors, test_doubles_json_cannot_hold_are_null);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(cli_json_suite)
