/*
 * test_endpoint.c — Check suite for endpoints: defaults from XDG_RUNTIME_DIR, validation of
 * ipc/tcp forms, the private-directory rules for ipc sockets, and the HOST:PORT addresses of the
 * HTTP front end.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <netinet/in.h>

#include "corral/endpoint.h"
#include "testutil.h"

static char tmp_root[] = "/tmp/corral-test-endpoint-XXXXXX";

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_root, "/tmp/corral-test-endpoint-XXXXXX");
}

START_TEST(test_default_uses_xdg_runtime_dir) {
    char buf[ENDPOINT_MAX];
    setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
    ck_assert_int_eq(endpoint_default(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "ipc:///run/user/1000/corral/corral.sock");
    unsetenv("XDG_RUNTIME_DIR");
    ck_assert_int_eq(endpoint_default(buf, sizeof buf, NULL), CORRAL_OK);
    char want[64];
    snprintf(want, sizeof want, "ipc:///tmp/corral-%u/corral.sock", (unsigned)getuid());
    ck_assert_str_eq(buf, want);
    setenv("CORRAL_ENDPOINT", "tcp://127.0.0.1:7070", 1);
    ck_assert_int_eq(endpoint_for_client(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "tcp://127.0.0.1:7070");
    unsetenv("CORRAL_ENDPOINT");
}
END_TEST

START_TEST(test_valid_endpoints) {
    ck_assert_int_eq(endpoint_validate("ipc:///tmp/x/corral.sock", NULL), CORRAL_OK);
    ck_assert_int_eq(endpoint_validate("tcp://127.0.0.1:5555", NULL), CORRAL_OK);
    ck_assert_int_eq(endpoint_validate("tcp://localhost:1", NULL), CORRAL_OK);
    ck_assert_int_eq(endpoint_validate("tcp://[::1]:65535", NULL), CORRAL_OK);
}
END_TEST

START_TEST(test_prepare_creates_private_dir) {
    char ep[ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "ipc://%s/sock/corral.sock", tmp_root);
    corral_error err;
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_OK);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sock", tmp_root);
    struct stat st;
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
}
END_TEST

START_TEST(test_long_paths_rejected) {
    char ep[ENDPOINT_MAX];
    memset(ep, 'a', sizeof ep);
    memcpy(ep, "ipc:///", 7);
    ep[200] = '\0'; /* fits ENDPOINT_MAX, not a Unix socket address (108) */
    corral_error err;
    ck_assert_int_eq(endpoint_validate(ep, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "Unix socket"));
    char huge[ENDPOINT_MAX + 10];
    memset(huge, 'a', sizeof huge);
    huge[sizeof huge - 1] = '\0';
    ck_assert_int_eq(endpoint_validate(huge, &err), CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_bad_endpoints_named) {
    corral_error err;
    ck_assert_int_eq(endpoint_validate("tcp://0.0.0.0:5555", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "loopback"));
    ck_assert_int_eq(endpoint_validate("tcp://127.0.0.1:0", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(endpoint_validate("tcp://127.0.0.1:99999", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(endpoint_validate("ipc://relative.sock", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "absolute"));
    ck_assert_int_eq(endpoint_validate("inproc://x", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(endpoint_validate("", &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(endpoint_validate(NULL, &err), CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_http_addresses) {
    endpoint_addr a;
    ck_assert_int_eq(endpoint_parse_address("127.0.0.1:11435", &a, NULL), CORRAL_OK);
    ck_assert(a.loopback && !a.ipv6);
    ck_assert_int_eq(ntohs(((struct sockaddr_in *)&a.addr)->sin_port), 11435);
    ck_assert_int_eq(endpoint_parse_address("localhost:1", &a, NULL), CORRAL_OK);
    ck_assert(a.loopback);
    ck_assert_int_eq(endpoint_parse_address("127.3.4.5:80", &a, NULL), CORRAL_OK);
    ck_assert(a.loopback);
    ck_assert_int_eq(endpoint_parse_address("[::1]:65535", &a, NULL), CORRAL_OK);
    ck_assert(a.loopback && a.ipv6);
    ck_assert_int_eq(endpoint_parse_address("0.0.0.0:8080", &a, NULL), CORRAL_OK);
    ck_assert(!a.loopback);
    ck_assert_int_eq(endpoint_parse_address("[::]:8080", &a, NULL), CORRAL_OK);
    ck_assert(!a.loopback && a.ipv6);
    ck_assert_int_eq(endpoint_parse_address("192.168.1.2:80", &a, NULL), CORRAL_OK);
    ck_assert(!a.loopback);
}
END_TEST

START_TEST(test_bad_http_addresses_named) {
    endpoint_addr a;
    corral_error err;
    static const char *const bad[] = {"127.0.0.1",    "127.0.0.1:0",    "127.0.0.1:65536",
                                      "127.0.0.1:-1", "127.0.0.1:+80",  "127.0.0.1:80x",
                                      ":80",          "example.com:80", "[::1:80",
                                      "[nothing]:80", "1.2.3:80",       "[]:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(endpoint_parse_address(bad[i], &a, &err) == CORRAL_INVALID_ARGUMENT, "%s",
                      bad[i]);
        ck_assert_msg(strstr(err.message, bad[i]) != NULL, "%s: %s", bad[i], err.message);
    }
}
END_TEST

START_TEST(test_open_dir_refused) {
    char dir[128], ep[ENDPOINT_MAX];
    snprintf(dir, sizeof dir, "%s/open", tmp_root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    snprintf(ep, sizeof ep, "ipc://%s/corral.sock", dir);
    corral_error err;
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "mode 777"));
    ck_assert_ptr_nonnull(strstr(err.message, dir));
}
END_TEST

START_TEST(test_dir_others_may_enter_but_not_write) {
    /* Other users may be let in to connect (corrald authenticates them), never to write. */
    char dir[128], ep[ENDPOINT_MAX];
    snprintf(dir, sizeof dir, "%s/shared", tmp_root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0711), 0);
    snprintf(ep, sizeof ep, "ipc://%s/corral.sock", dir);
    corral_error err;
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_OK);
    ck_assert_int_eq(chmod(dir, 0750), 0);
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_OK);
    ck_assert_int_eq(chmod(dir, 0770), 0);
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "could replace the socket"));
}
END_TEST

START_TEST(test_file_instead_of_dir_refused) {
    char path[128], ep[ENDPOINT_MAX];
    snprintf(path, sizeof path, "%s/file", tmp_root);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    snprintf(ep, sizeof ep, "ipc://%s/corral.sock", path);
    corral_error err;
    ck_assert_int_eq(endpoint_prepare_bind(ep, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "not a directory"));
}
END_TEST

static Suite *endpoint_suite(void) {
    Suite *s = suite_create("endpoint");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_default_uses_xdg_runtime_dir);
    tcase_add_test(core, test_valid_endpoints);
    tcase_add_test(core, test_prepare_creates_private_dir);
    tcase_add_test(core, test_http_addresses);
    tcase_add_test(core, test_dir_others_may_enter_but_not_write);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_long_paths_rejected);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_bad_endpoints_named);
    tcase_add_test(errors, test_bad_http_addresses_named);
    tcase_add_test(errors, test_open_dir_refused);
    tcase_add_test(errors, test_file_instead_of_dir_refused);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(endpoint_suite)
