/*
 * test_log.c — Check suite for the logging module: exact line format, quoting and escaping of
 * values, truncation of long lines, level parsing and filtering.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/log.h"
#include "testutil.h"

/* 2026-11-30T11:34:00.123Z */
static const int64_t T0 = 1796038440123LL;

START_TEST(test_format_exact_line) {
    char buf[512];
    const log_field fields[] = {LOG_STR("model", "stories"), LOG_UINT("bytes", 1185376),
                                LOG_INT("delta", -3), LOG_F64("ratio", 0.5), LOG_END_};
    size_t len = log_format(buf, sizeof buf, T0, LOG_LEVEL_INFO, "model loaded", fields);
    const char *want = "2026-11-30T11:34:00.123Z level=info msg=\"model loaded\" model=stories "
                       "bytes=1185376 delta=-3 ratio=0.5\n";
    ck_assert_str_eq(buf, want);
    ck_assert_uint_eq(len, strlen(want));
}
END_TEST

START_TEST(test_values_are_quoted_and_escaped) {
    char buf[512];
    const log_field fields[] = {LOG_STR("a", "two words"),
                                LOG_STR("b", "say \"hi\""),
                                LOG_STR("c", "line\nbreak"),
                                LOG_STR("d", "k=v"),
                                LOG_STR("e", ""),
                                LOG_STR("f", NULL),
                                LOG_STR("g", "\x01"),
                                LOG_STR("h", "caf\xc3\xa9"),
                                LOG_END_};
    log_format(buf, sizeof buf, T0, LOG_LEVEL_WARN, "x", fields);
    ck_assert_str_eq(buf, "2026-11-30T11:34:00.123Z level=warn msg=x a=\"two words\" "
                          "b=\"say \\\"hi\\\"\" c=\"line\\nbreak\" d=\"k=v\" e=\"\" f=(null) "
                          "g=\"\\x01\" h=caf\xc3\xa9\n");
    /* The only newline is the terminator: a value can never start a new record. */
    ck_assert_ptr_eq(strchr(buf, '\n'), buf + strlen(buf) - 1);
}
END_TEST

/* The byte escapes quoted values use (and gguf's value printer with them), byte by byte. */
START_TEST(test_escape_byte_table) {
    char hex[LOG_ESCAPE_MAX];
    int escaped = 0;
    for (unsigned c = 0; c < 256; c++) {
        const char *esc = log_escape_byte((uint8_t)c, hex);
        escaped += esc != NULL;
        ck_assert_int_eq(esc != NULL, c < 0x20 || c == '"' || c == '\\' || c == 0x7f);
    }
    ck_assert_int_eq(escaped, 32 + 3);
    ck_assert_str_eq(log_escape_byte('"', hex), "\\\"");
    ck_assert_str_eq(log_escape_byte('\\', hex), "\\\\");
    ck_assert_str_eq(log_escape_byte('\n', hex), "\\n");
    ck_assert_str_eq(log_escape_byte('\r', hex), "\\r");
    ck_assert_str_eq(log_escape_byte('\t', hex), "\\t");
    ck_assert_str_eq(log_escape_byte(0x00, hex), "\\x00");
    ck_assert_str_eq(log_escape_byte(0x1f, hex), "\\x1f");
    ck_assert_str_eq(log_escape_byte(0x7f, hex), "\\x7f");
    ck_assert_ptr_null(log_escape_byte(0xc3, hex)); /* UTF-8 passes */
}
END_TEST

START_TEST(test_level_parse_and_names) {
    log_level l;
    ck_assert_int_eq(log_level_parse("DEBUG", &l), 0);
    ck_assert_int_eq(l, LOG_LEVEL_DEBUG);
    ck_assert_int_eq(log_level_parse("trace", &l), 0);
    ck_assert_int_eq(l, LOG_LEVEL_TRACE);
    for (int i = 0; i < LOG_LEVEL_COUNT; i++) {
        ck_assert_int_eq(log_level_parse(log_level_name((log_level)i), &l), 0);
        ck_assert_int_eq(l, i);
    }
}
END_TEST

START_TEST(test_filtering_by_level) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    int old = log_set_fd(fds[1]);
    log_set_level(LOG_LEVEL_WARN);
    log_info("hidden");
    log_warn("shown", LOG_INT("n", 1));
    log_set_fd(old);
    close(fds[1]);
    char buf[512] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    ck_assert_int_gt(n, 0);
    ck_assert_ptr_null(strstr(buf, "hidden"));
    ck_assert_ptr_nonnull(strstr(buf, "level=warn msg=shown n=1\n"));
    ck_assert(log_enabled(LOG_LEVEL_ERROR));
    ck_assert(!log_enabled(LOG_LEVEL_INFO));
    log_set_level(LOG_LEVEL_INFO);
}
END_TEST

START_TEST(test_long_line_is_cut_with_marker) {
    char big[8192];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const log_field fields[] = {LOG_STR("blob", big), LOG_END_};
    char buf[128];
    size_t len = log_format(buf, sizeof buf, T0, LOG_LEVEL_ERROR, "m", fields);
    ck_assert_uint_eq(len, sizeof buf - 1);
    ck_assert_uint_eq(strlen(buf), len);
    ck_assert_str_eq(buf + len - 4, "...\n");
}
END_TEST

/* A limit lets `burst` records through per window and counts the rest, which the next record let
 * through reports; a new window (or a clock that went back) starts the count again. */
START_TEST(test_limit) {
    log_limit l = LOG_LIMIT_INIT(3, 1000);
    uint64_t left_out = 99;
    for (int i = 0; i < 3; i++) {
        ck_assert(log_limit_allow_at(&l, 5000 + i, &left_out));
        ck_assert_uint_eq(left_out, 0);
    }
    for (int i = 0; i < 1000; i++) ck_assert(!log_limit_allow_at(&l, 5100 + i % 800, &left_out));
    ck_assert(log_limit_allow_at(&l, 6000, &left_out)); /* the next window */
    ck_assert_uint_eq(left_out, 1000);
    ck_assert(log_limit_allow_at(&l, 6001, NULL));
    ck_assert(log_limit_allow_at(&l, 6002, &left_out));
    ck_assert_uint_eq(left_out, 0);
    ck_assert(!log_limit_allow_at(&l, 6003, &left_out));
    ck_assert(log_limit_allow_at(&l, 10, &left_out)); /* the clock went back: a new window */
    ck_assert_uint_eq(left_out, 1);
    /* The real clock: a burst goes through at once, the next is held back. */
    static log_limit now = LOG_LIMIT_INIT(2, 60000);
    ck_assert(log_limit_allow(&now, NULL) && log_limit_allow(&now, NULL));
    ck_assert(!log_limit_allow(&now, NULL));
}
END_TEST

START_TEST(test_tiny_buffers) {
    char buf[4] = "zzz";
    const log_field fields[] = {LOG_END_};
    ck_assert_uint_eq(log_format(buf, 0, T0, LOG_LEVEL_INFO, "m", fields), 0);
    ck_assert_str_eq(buf, "zzz");
    size_t len = log_format(buf, sizeof buf, T0, LOG_LEVEL_INFO, "m", fields);
    ck_assert_uint_lt(len, sizeof buf);
    ck_assert_uint_eq(strlen(buf), len);
}
END_TEST

START_TEST(test_bad_level_names) {
    log_level l = LOG_LEVEL_INFO;
    ck_assert_int_eq(log_level_parse("verbose", &l), -1);
    ck_assert_int_eq(log_level_parse("", &l), -1);
    ck_assert_int_eq(log_level_parse(NULL, &l), -1);
    ck_assert_int_eq(l, LOG_LEVEL_INFO);
    ck_assert_str_eq(log_level_name((log_level)99), "?");
    setenv("CORRAL_LOG_LEVEL", "loud", 1);
    ck_assert_int_eq(log_level_from_env(), -1);
    ck_assert_int_eq(log_get_level(), LOG_LEVEL_INFO);
    setenv("CORRAL_LOG_LEVEL", "error", 1);
    ck_assert_int_eq(log_level_from_env(), 0);
    ck_assert_int_eq(log_get_level(), LOG_LEVEL_ERROR);
    unsetenv("CORRAL_LOG_LEVEL");
    log_set_level(LOG_LEVEL_INFO);
}
END_TEST

static Suite *log_suite(void) {
    Suite *s = suite_create("log");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_format_exact_line);
    tcase_add_test(core, test_values_are_quoted_and_escaped);
    tcase_add_test(core, test_escape_byte_table);
    tcase_add_test(core, test_level_parse_and_names);
    tcase_add_test(core, test_filtering_by_level);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_long_line_is_cut_with_marker);
    tcase_add_test(limits, test_limit);
    tcase_add_test(limits, test_tiny_buffers);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bad_level_names);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(log_suite)
