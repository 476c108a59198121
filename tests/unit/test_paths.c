/*
 * test_paths.c — Check suite for corral/paths.h: the per-user swap and cache folders (XDG base
 * directories, then HOME), `mkdir -p` with mode 0700, and joining a relative path to its folder
 * without `dir/..` detours (but keeping a `..` after a symbolic link).
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/paths.h"
#include "testutil.h"

static char tmp_root[] = "/tmp/corral-test-paths-XXXXXX";

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s; rm -rf %s", tmp_root, tmp_root);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_root, "/tmp/corral-test-paths-XXXXXX");
}

static unsigned mode_of(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (unsigned)(st.st_mode & 0777);
}

/* What paths_join makes of base + rel, in a static buffer. */
static const char *joined(const char *base, const char *rel) {
    static char out[PATH_MAX];
    corral_error err;
    ck_assert_int_eq(paths_join(base, rel, out, sizeof out, &err), CORRAL_OK);
    return out;
}

START_TEST(test_user_dirs_follow_xdg_then_home) {
    char buf[PATH_MAX];
    setenv("XDG_STATE_HOME", "/srv/state", 1);
    setenv("XDG_CACHE_HOME", "/srv/cache", 1);
    ck_assert_int_eq(paths_user_swap_dir(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "/srv/state/corral/swap");
    ck_assert_int_eq(paths_user_cache_dir(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "/srv/cache/corral");
    /* Unset, or relative (which the XDG specification says to ignore): the home's folders. */
    unsetenv("XDG_STATE_HOME");
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    setenv("HOME", "/home/ann", 1);
    ck_assert_int_eq(paths_user_swap_dir(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "/home/ann/.local/state/corral/swap");
    ck_assert_int_eq(paths_user_cache_dir(buf, sizeof buf, NULL), CORRAL_OK);
    ck_assert_str_eq(buf, "/home/ann/.cache/corral");
    unsetenv("XDG_CACHE_HOME");
}
END_TEST

START_TEST(test_make_dir_creates_parents_private) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/a/b/c", tmp_root);
    corral_error err;
    ck_assert_int_eq(paths_make_dir(dir, &err), CORRAL_OK);
    ck_assert_uint_eq(mode_of(dir), 0700);
    snprintf(dir, sizeof dir, "%s/a", tmp_root);
    ck_assert_uint_eq(mode_of(dir), 0700);
    /* Again: an existing folder is fine and keeps its mode. */
    ck_assert_int_eq(chmod(dir, 0755), 0);
    snprintf(dir, sizeof dir, "%s/a/b/c/", tmp_root);
    ck_assert_int_eq(paths_make_dir(dir, &err), CORRAL_OK);
    snprintf(dir, sizeof dir, "%s/a", tmp_root);
    ck_assert_uint_eq(mode_of(dir), 0755);
}
END_TEST

START_TEST(test_join_removes_detours) {
    /* tmp/corral/config beside tmp/shared, as the repository's config/ sits beside ../shared. */
    char base[PATH_MAX], want[PATH_MAX];
    snprintf(base, sizeof base, "%s/corral/config", tmp_root);
    ck_assert_int_eq(paths_make_dir(base, NULL), CORRAL_OK);
    snprintf(want, sizeof want, "%s/shared/m.gguf", tmp_root);
    ck_assert_str_eq(joined(base, "../../shared/m.gguf"), want);
    snprintf(want, sizeof want, "%s/corral/config/c/d", tmp_root);
    ck_assert_str_eq(joined(base, "./c//d/."), want);
    ck_assert_str_eq(joined(base, "/abs/./x"), "/abs/x");
    ck_assert_str_eq(joined(NULL, "rel//x/"), "rel/x");
    ck_assert_str_eq(joined("/", "../../x"), "/x");
    ck_assert_str_eq(joined("/tmp", ".."), "/");
    /* Relative results stay relative (folders relative to the working directory); a `..` that
     * climbs above the start is kept. */
    ck_assert_int_eq(chdir(tmp_root), 0);
    ck_assert_str_eq(joined("corral/config", "../x"), "corral/x");
    ck_assert_str_eq(joined("corral", "../../x"), "../x");
    ck_assert_str_eq(joined(".", "."), ".");
    ck_assert_int_eq(chdir("/"), 0);
}
END_TEST

START_TEST(test_join_keeps_dotdot_after_symlink) {
    /* tmp/link -> tmp/real/deep: "link/.." is tmp/real for the kernel, not tmp. */
    char real[PATH_MAX], link_path[PATH_MAX], base[PATH_MAX], want[PATH_MAX];
    snprintf(real, sizeof real, "%s/real/deep", tmp_root);
    ck_assert_int_eq(paths_make_dir(real, NULL), CORRAL_OK);
    snprintf(link_path, sizeof link_path, "%s/link", tmp_root);
    ck_assert_int_eq(symlink(real, link_path), 0);
    snprintf(base, sizeof base, "%s/link", tmp_root);
    snprintf(want, sizeof want, "%s/link/../m.gguf", tmp_root);
    ck_assert_str_eq(joined(base, "../m.gguf"), want);
}
END_TEST

START_TEST(test_join_keeps_dotdot_of_what_is_not_a_folder) {
    /* A missing folder: the kernel would fail on "missing/..", so the text is left as it is. */
    char base[PATH_MAX], want[PATH_MAX];
    snprintf(base, sizeof base, "%s/missing", tmp_root);
    snprintf(want, sizeof want, "%s/missing/../x", tmp_root);
    ck_assert_str_eq(joined(base, "../x"), want);
}
END_TEST

START_TEST(test_long_paths_refused) {
    char base[PATH_MAX + 64];
    memset(base, 'a', sizeof base - 1);
    base[0] = '/';
    base[sizeof base - 1] = '\0';
    char out[64];
    corral_error err;
    ck_assert_int_eq(paths_join("/short", "name", out, sizeof out, &err), CORRAL_OK);
    ck_assert_int_eq(paths_join(base, "x", out, sizeof out, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "path longer than 63 bytes"));
    ck_assert_int_eq(paths_make_dir(base, &err), CORRAL_INVALID_ARGUMENT);
    setenv("XDG_STATE_HOME", base, 1);
    char buf[PATH_MAX];
    ck_assert_int_eq(paths_user_swap_dir(buf, sizeof buf, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "XDG_STATE_HOME"));
    unsetenv("XDG_STATE_HOME");
}
END_TEST

START_TEST(test_make_dir_errors_named) {
    char file[PATH_MAX], dir[PATH_MAX];
    snprintf(file, sizeof file, "%s/file", tmp_root);
    FILE *fp = fopen(file, "w");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    corral_error err;
    ck_assert_int_eq(paths_make_dir(file, &err), CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "not a directory"));
    snprintf(dir, sizeof dir, "%s/file/sub", tmp_root);
    ck_assert_int_eq(paths_make_dir(dir, &err), CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "cannot create the directory"));
    ck_assert_int_eq(paths_make_dir("", &err), CORRAL_INVALID_ARGUMENT);
    if (geteuid() != 0) { /* root writes anywhere */
        snprintf(dir, sizeof dir, "%s/locked", tmp_root);
        ck_assert_int_eq(mkdir(dir, 0500), 0);
        snprintf(dir, sizeof dir, "%s/locked/a/b", tmp_root);
        ck_assert_int_eq(paths_make_dir(dir, &err), CORRAL_IO);
        ck_assert_ptr_nonnull(strstr(err.message, "/locked/a"));
    }
}
END_TEST

static Suite *paths_suite(void) {
    Suite *s = suite_create("paths");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_user_dirs_follow_xdg_then_home);
    tcase_add_test(core, test_make_dir_creates_parents_private);
    tcase_add_test(core, test_join_removes_detours);
    tcase_add_test(core, test_join_keeps_dotdot_after_symlink);
    tcase_add_test(core, test_join_keeps_dotdot_of_what_is_not_a_folder);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_long_paths_refused);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_make_dir_errors_named);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(paths_suite)
