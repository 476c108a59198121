/*
 * test_curve.c — Check suite for CURVE key text and key files (base/curve.h): z85 against
 * libzmq's own codec, key files as `corral keygen` writes them, and every file refused by name.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "corral/curve.h"
#include "testutil.h"

static char tmp_dir[] = "/tmp/corral-test-curve-XXXXXX";

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-curve-XXXXXX");
}

static const char *write_file(const char *name, const char *text, mode_t mode) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
    ck_assert_int_eq(chmod(path, mode), 0);
    return path;
}

START_TEST(test_codec_agrees_with_libzmq) {
    uint64_t state = 7;
    for (int round = 0; round < 200; round++) {
        unsigned char key[CURVE_KEY_BYTES], back[CURVE_KEY_BYTES];
        for (size_t i = 0; i < sizeof key; i++) key[i] = (unsigned char)test_splitmix64(&state);
        if (round == 0) memset(key, 0, sizeof key);
        if (round == 1) memset(key, 0xff, sizeof key);
        char ours[CURVE_KEY_TEXT], theirs[CURVE_KEY_TEXT];
        curve_key_encode(key, ours);
        ck_assert_ptr_nonnull(zmq_z85_encode(theirs, key, sizeof key));
        ck_assert_str_eq(ours, theirs);
        ck_assert(curve_key_valid(ours));
        ck_assert_int_eq(curve_key_decode(ours, back), CORRAL_OK);
        ck_assert_mem_eq(back, key, sizeof key);
    }
}
END_TEST

START_TEST(test_key_files) {
    char public_key[CURVE_KEY_TEXT], secret_key[CURVE_KEY_TEXT];
    ck_assert_int_eq(zmq_curve_keypair(public_key, secret_key), 0);
    char text[256];
    snprintf(text, sizeof text, "# corral CURVE secret key\n\n  %s  \r\n# end\n", secret_key);
    const char *path = write_file("a.key", text, 0600);
    char got[CURVE_KEY_TEXT];
    corral_error err;
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_SECRET, got, &err), CORRAL_OK);
    ck_assert_str_eq(got, secret_key);
    /* Group may read a secret key file (a service group), others may not; a public one is
     * anyone's. */
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_SECRET, got, &err), CORRAL_OK);
    snprintf(text, sizeof text, "%s", public_key);
    path = write_file("a.pub", text, 0644);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_PUBLIC, got, &err), CORRAL_OK);
    ck_assert_str_eq(got, public_key);
}
END_TEST

START_TEST(test_limits) {
    /* Exactly 40 characters; the largest value a group may have is 2^32 - 1 ("%nSc0"). */
    ck_assert(curve_key_valid("%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0"));
    ck_assert(!curve_key_valid("%nSc1%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0"));
    ck_assert(!curve_key_valid("0000000000000000000000000000000000000000 "));
    ck_assert(!curve_key_valid("000000000000000000000000000000000000000"));
    ck_assert(!curve_key_valid(NULL));
    ck_assert(!curve_key_valid("000000000000000000000000000000000000000,"));
    /* A file larger than any key file is refused before it is read. */
    char *big = malloc(8192);
    memset(big, '#', 8191);
    big[8191] = '\0';
    const char *path = write_file("big.pub", big, 0644);
    free(big);
    char got[CURVE_KEY_TEXT];
    corral_error err;
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_PUBLIC, got, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "larger than 4096 bytes"));
}
END_TEST

START_TEST(test_bad_files_are_refused_by_name) {
    char public_key[CURVE_KEY_TEXT], secret_key[CURVE_KEY_TEXT], text[256];
    ck_assert_int_eq(zmq_curve_keypair(public_key, secret_key), 0);
    char got[CURVE_KEY_TEXT];
    corral_error err;
    /* A secret key other users may read. */
    snprintf(text, sizeof text, "%s\n", secret_key);
    const char *path = write_file("open.key", text, 0644);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_SECRET, got, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, path));
    ck_assert_ptr_nonnull(strstr(err.message, "mode 644"));
    ck_assert_ptr_nonnull(strstr(err.message, "chmod 600"));
    ck_assert_str_eq(got, "");
    /* Missing, a directory, two keys, no key, a broken key. */
    char missing[512];
    snprintf(missing, sizeof missing, "%s/none.key", tmp_dir);
    ck_assert_int_eq(curve_key_read(missing, CURVE_KEY_SECRET, got, &err), CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, missing));
    ck_assert_int_eq(curve_key_read(tmp_dir, CURVE_KEY_PUBLIC, got, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "not a regular file"));
    snprintf(text, sizeof text, "%s\n%s\n", public_key, public_key);
    path = write_file("two.pub", text, 0644);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_PUBLIC, got, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "does not hold one CURVE key"));
    path = write_file("none.pub", "# nothing here\n", 0644);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_PUBLIC, got, &err), CORRAL_INVALID_ARGUMENT);
    snprintf(text, sizeof text, "%.39s\n", public_key);
    path = write_file("short.pub", text, 0644);
    ck_assert_int_eq(curve_key_read(path, CURVE_KEY_PUBLIC, got, &err), CORRAL_INVALID_ARGUMENT);
    unsigned char raw[CURVE_KEY_BYTES];
    ck_assert_int_eq(curve_key_decode("not a key", raw), CORRAL_INVALID_ARGUMENT);
}
END_TEST

static Suite *curve_suite(void) {
    Suite *s = suite_create("curve");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_codec_agrees_with_libzmq);
    tcase_add_test(core, test_key_files);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, setup, teardown);
    tcase_add_test(limits, test_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_bad_files_are_refused_by_name);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(curve_suite)
