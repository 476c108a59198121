/*
 * test_cli_json.c — the corral CLI's --json helpers (clients/cli/json.c, on jansson): strings made
 * valid (invalid UTF-8 replaced by U+FFFD, one per byte; valid multi-byte UTF-8 kept), escaping
 * as jansson writes it, 64-bit counts, numbers JSON cannot hold, the compact and indented forms,
 * and a value that could not be made failing the print. Expected texts are written out by hand
 * from RFC 8259.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "testutil.h"

/* Print doc into a static buffer; returns the text (and *rc the print's result). */
static const char *render(json_t *doc, int indent, int *rc) {
    static char buf[4096];
    memset(buf, 0, sizeof buf);
    FILE *fp = fmemopen(buf, sizeof buf - 1, "w");
    ck_assert_ptr_nonnull(fp);
    *rc = cli_json_print(&doc, fp, indent);
    ck_assert_ptr_null(doc);
    fclose(fp);
    return buf;
}

START_TEST(test_nested_document) {
    json_t *doc = json_object(), *list = json_array();
    cli_json_set(doc, "a", cli_json_uint(9223372036854775807ull));
    cli_json_append(list, json_integer(-3));
    cli_json_append(list, json_true());
    cli_json_append(list, json_null());
    cli_json_append(list, json_object());
    cli_json_append(list, json_array());
    cli_json_set(doc, "b", list);
    cli_json_set(doc, "c", cli_json_str(NULL));
    cli_json_set(doc, "d", cli_json_uint(18446744073709551615ull)); /* past int64: a real */
    int rc;
    ck_assert_str_eq(render(doc, 0, &rc), "{\"a\":9223372036854775807,\"b\":[-3,true,null,{},[]],"
                                          "\"c\":null,\"d\":1.8446744073709552e19}\n");
    ck_assert_int_eq(rc, 0);
}
END_TEST

START_TEST(test_indented_keeps_member_order) {
    json_t *doc = json_object();
    cli_json_set(doc, "z", cli_json_real(0.5));
    cli_json_set(doc, "a", cli_json_str("x"));
    int rc;
    ck_assert_str_eq(render(doc, 2, &rc), "{\n  \"z\": 0.5,\n  \"a\": \"x\"\n}\n");
    ck_assert_int_eq(rc, 0);
}
END_TEST

START_TEST(test_string_escapes) {
    json_t *doc = json_array();
    cli_json_append(doc, cli_json_str("say \"hi\"\\ now"));
    cli_json_append(doc, cli_json_str("tab\there\nnew\r\x01\x1f"));
    cli_json_append(doc, cli_json_str("caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80"));
    int rc;
    ck_assert_str_eq(render(doc, 0, &rc),
                     "[\"say \\\"hi\\\"\\\\ now\",\"tab\\there\\nnew\\r\\u0001\\u001F\","
                     "\"caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80\"]\n");
}
END_TEST

START_TEST(test_invalid_utf8_becomes_replacement) {
    static const char *const bad[] = {
        "a\xff"
        "b",                /* a byte that never starts UTF-8 */
        "\xc3",             /* truncated sequence at the end */
        "\xc0\xaf",         /* overlong "/" */
        "\xed\xa0\x80",     /* a UTF-16 surrogate */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
        "\xe2\x82"
        "A", /* a cut sequence: one U+FFFD per byte, not per maximal subpart */
    };
    json_t *doc = json_array();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cli_json_append(doc, cli_json_str(bad[i]));
#define R "\xef\xbf\xbd"
    int rc;
    ck_assert_str_eq(render(doc, 0, &rc), "[\"a" R "b\",\"" R "\",\"" R R "\",\"" R R R
                                          "\",\"" R R R R "\",\"" R R "A\"]\n");
#undef R
}
END_TEST

START_TEST(test_doubles_json_cannot_hold_are_null) {
    json_t *doc = json_array();
    cli_json_append(doc, cli_json_real(0.5));
    cli_json_append(doc, cli_json_real(NAN));
    cli_json_append(doc, cli_json_real(INFINITY));
    int rc;
    ck_assert_str_eq(render(doc, 0, &rc), "[0.5,null,null]\n");
}
END_TEST

START_TEST(test_a_value_not_made_fails_the_print) {
    json_t *doc = json_object();
    cli_json_set(doc, "lost", NULL); /* as when memory ran out */
    int rc;
    render(doc, 0, &rc);
    ck_assert_int_eq(rc, -1);
    /* The failure is reported once: the next document prints. */
    doc = json_object();
    render(doc, 0, &rc);
    ck_assert_int_eq(rc, 0);
    json_t *none = NULL;
    render(none, 0, &rc);
    ck_assert_int_eq(rc, -1);
}
END_TEST

static Suite *cli_json_suite(void) {
    Suite *s = suite_create("cli_json");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_nested_document);
    tcase_add_test(core, test_indented_keeps_member_order);
    tcase_add_test(core, test_string_escapes);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_doubles_json_cannot_hold_are_null);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_invalid_utf8_becomes_replacement);
    tcase_add_test(errors, test_a_value_not_made_fails_the_print);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(cli_json_suite)
