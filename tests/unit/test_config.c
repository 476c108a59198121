/*
 * test_config.c — Check suite for corrald's configuration: defaults, a file found and loaded, a
 * file not found, and every kind of bad content reported as file:line:column.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "testutil.h"

static char tmp_dir[] = "/tmp/corral-test-config-XXXXXX";

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-config-XXXXXX");
}

static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
    return path;
}

/* Load text and expect failure with a message containing `want`. */
static void expect_error(const char *text, const char *want) {
    corral_error err;
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c == NULL, "accepted: %s", text);
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
}

START_TEST(test_defaults) {
    corral_error err;
    cfg *c = cfg_new_defaults(&err);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(c->n_listen, 0);
    ck_assert_int_eq(c->log_level, LOG_LEVEL_INFO);
    ck_assert_uint_eq(c->max_message_bytes, 1u << 20);
    ck_assert_ptr_null(c->source_path);
    cfg_destroy(&c);
    ck_assert_ptr_null(c);
    cfg_destroy(&c); /* NULL-safe */
}
END_TEST

START_TEST(test_file_found_and_loaded) {
    const char *path = write_file("corral.yaml", "# comment\n"
                                                 "listen: [\"ipc:///tmp/a/corral.sock\", "
                                                 "\"tcp://127.0.0.1:7000\"]\n"
                                                 "log_level: debug\n"
                                                 "limits:\n"
                                                 "  max_message_bytes: 2MiB\n");
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_str_eq(c->source_path, path);
    ck_assert_uint_eq(c->n_listen, 2);
    ck_assert_str_eq(c->listen[1], "tcp://127.0.0.1:7000");
    ck_assert_int_eq(c->log_level, LOG_LEVEL_DEBUG);
    ck_assert_uint_eq(c->max_message_bytes, 2u << 20);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_file_not_found) {
    char path[512];
    snprintf(path, sizeof path, "%s/missing.yaml", tmp_dir);
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, path));
}
END_TEST

START_TEST(test_default_file_search) {
    char buf[1024];
    setenv("CORRAL_CONFIG", "/x/y.yaml", 1);
    ck_assert_int_eq(cfg_find_default_file(buf, sizeof buf), 1);
    ck_assert_str_eq(buf, "/x/y.yaml");
    unsetenv("CORRAL_CONFIG");

    setenv("XDG_CONFIG_HOME", tmp_dir, 1);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/corral", tmp_dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    const char *path = write_file("corral/corral.yaml", "log_level: warn\n");
    ck_assert_int_eq(cfg_find_default_file(buf, sizeof buf), 1);
    ck_assert_str_eq(buf, path);
    unsetenv("XDG_CONFIG_HOME");
}
END_TEST

START_TEST(test_empty_and_comment_only_files) {
    corral_error err;
    cfg *c = cfg_load_string("", 0, "empty.yaml", &err);
    ck_assert_ptr_nonnull(c);
    cfg_destroy(&c);
    c = cfg_load_string("# nothing\n", 10, "c.yaml", &err);
    ck_assert_ptr_nonnull(c);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_byte_size_bounds) {
    corral_error err;
    const char *ok = "limits: {max_message_bytes: 1KiB}\n";
    cfg *c = cfg_load_string(ok, strlen(ok), "t.yaml", &err);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(c->max_message_bytes, 1024);
    cfg_destroy(&c);
    expect_error("limits: {max_message_bytes: 1023}\n", "out of range");
    expect_error("limits: {max_message_bytes: 257MiB}\n", "out of range");
    expect_error("limits: {max_message_bytes: 99999999999999999999999}\n", "byte size");
    expect_error("limits: {max_message_bytes: 16777216TiB}\n", "byte size");
}
END_TEST

START_TEST(test_unknown_key_has_position) {
    expect_error("log_level: info\nlimits:\n  max_mesage_bytes: 10\n",
                 "t.yaml:3:3: unknown key 'limits.max_mesage_bytes'");
    expect_error("colour: blue\n", "t.yaml:1:1: unknown key 'colour'");
}
END_TEST

START_TEST(test_wrong_types) {
    expect_error("limits: 5\n", "t.yaml:1:9: limits: expected a mapping");
    expect_error("limits: {max_message_bytes: \"1MiB\"}\n", "expected a plain value, got a quoted");
    expect_error("limits: {max_message_bytes: [1]}\n", "got a list");
    expect_error("limits: {max_message_bytes: -5}\n", "expected a byte size");
    expect_error("log_level: loud\n", "t.yaml:1:12: log_level: expected one of");
    expect_error("listen: {a: b}\n", "expected an endpoint or a list");
    expect_error("listen: [\"tcp://8.8.8.8:80\"]\n", "loopback");
    expect_error("- a\n- b\n", "top level must be a mapping");
}
END_TEST

START_TEST(test_syntax_and_duplicates) {
    expect_error("log_level: [info\n", "YAML syntax error");
    expect_error("log_level: info\nlog_level: debug\n",
                 "t.yaml:2:1: duplicate key 'log_level' (first at line 1)");
}
END_TEST

static Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_defaults);
    tcase_add_test(core, test_file_found_and_loaded);
    tcase_add_test(core, test_file_not_found);
    tcase_add_test(core, test_default_file_search);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_empty_and_comment_only_files);
    tcase_add_test(limits, test_byte_size_bounds);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_unknown_key_has_position);
    tcase_add_test(errors, test_wrong_types);
    tcase_add_test(errors, test_syntax_and_duplicates);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(config_suite)
