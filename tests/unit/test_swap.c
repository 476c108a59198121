/*
 * test_swap.c — Check suite for session images in the swap directory: a cache written out and
 * read back is identical; stale, corrupt and truncated images are refused and deleted; leftovers
 * of crashed writes are removed at open; an unwritable directory is reported, not fatal; the
 * images an earlier run left keep their sessions' owners.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "swap.h"
#include "testutil.h"

static char dir[] = "/tmp/corral-test-swap-XXXXXX";
static model *m;
static model_runner *r;

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(dir));
    corral_error err;
    m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    ck_assert_ptr_nonnull(m);
    r = model_runner_new(m, 0, NULL, &err);
}

static void teardown(void) {
    model_runner_destroy(&r);
    model_destroy(&m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(dir, "/tmp/corral-test-swap-XXXXXX");
}

static swap_session_key key_for(const char *session, uint32_t context) {
    return (swap_session_key){.app = "app",
                              .session = session,
                              .model_name = "stories",
                              .model_fingerprint = model_file_fingerprint(m),
                              .context = context,
                              .kv_f32 = 0};
}

/* A cache holding n positions of real activations. */
static kv_cache *filled_cache(int32_t *ids, uint32_t n) {
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F16, &err);
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(1 + (i * 37) % 500);
    float logits[512];
    ck_assert_int_eq(model_forward(r, kv, ids, n, MODEL_LOGITS_LAST, logits, &err), CORRAL_OK);
    return kv;
}

static int count_files(const char *needle) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c -- '%s' > %s/.count", dir, needle, dir);
    if (system(cmd) < 0) return -1;
    char path[128];
    snprintf(path, sizeof path, "%s/.count", dir);
    FILE *fp = fopen(path, "r");
    int n = -1;
    if (fp && fscanf(fp, "%d", &n) != 1) n = -1;
    if (fp) fclose(fp);
    unlink(path);
    return n;
}

START_TEST(test_round_trip) {
    swap_dir *d = swap_dir_open(dir, 3600000, NULL);
    ck_assert(swap_dir_writable(d));
    int32_t ids[20];
    kv_cache *kv = filled_cache(ids, 20);
    swap_session_key key = key_for("conv-1", 64);
    corral_error err;
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 20, &err), CORRAL_OK);
    ck_assert(swap_session_exists(d, &key));
    kv_cache *back = kv_cache_new(m, 64, KV_TYPE_F16, &err);
    int32_t *tokens;
    uint32_t n;
    ck_assert_int_eq(swap_session_read(d, &key, back, &tokens, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 20);
    ck_assert_uint_eq(kv_cache_n_pos(back), 20);
    ck_assert(memcmp(tokens, ids, sizeof ids) == 0);
    for (uint32_t il = 0; il < model_get_hparams(m)->n_layer; il++)
        for (uint32_t h = 0; h < model_get_hparams(m)->n_head_kv; h++)
            for (int v = 0; v < 2; v++) {
                size_t rb, rb2;
                const void *a = kv_cache_rows(kv, il, h, v, &rb),
                           *b = kv_cache_rows(back, il, h, v, &rb2);
                ck_assert_uint_eq(rb, rb2);
                ck_assert(memcmp(a, b, 20 * rb) == 0);
            }
    /* Reading consumes the image. */
    ck_assert(!swap_session_exists(d, &key));
    free(tokens);
    kv_cache_destroy(&kv);
    kv_cache_destroy(&back);
    swap_dir_destroy(&d);
}
END_TEST

/* The path of the only session image in the directory. */
static void only_image(char *path, size_t size) {
    char cmd[256], list[128];
    snprintf(list, sizeof list, "%s/.name", dir);
    snprintf(cmd, sizeof cmd, "ls %s/session-*.gguf > %s", dir, list);
    ck_assert_int_eq(system(cmd), 0);
    FILE *fp = fopen(list, "r");
    ck_assert(fgets(path, (int)size, fp) != NULL);
    fclose(fp);
    unlink(list);
    path[strcspn(path, "\n")] = '\0';
}

/* Whose sessions the images left by an earlier corrald hold: the next one knows at open, so that
 * another app naming such a session is refused before its owner has claimed it. */
START_TEST(test_images_of_an_earlier_run_keep_their_owner) {
    swap_dir *d = swap_dir_open(dir, 3600000, NULL);
    int32_t ids[8];
    kv_cache *kv = filled_cache(ids, 8);
    swap_session_key key = key_for("conv", 64); /* app "app" */
    corral_error err;
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 8, &err), CORRAL_OK);
    /* Only what the opening scan found is indexed: this run's sessions are the core's. */
    ck_assert(!swap_session_held_elsewhere(d, "conv", "other"));
    swap_dir_destroy(&d);

    d = swap_dir_open(dir, 3600000, NULL);
    ck_assert(swap_session_held_elsewhere(d, "conv", "other"));
    ck_assert(swap_session_held_elsewhere(d, "conv", "")); /* the default app is another */
    ck_assert(!swap_session_held_elsewhere(d, "conv", "app"));
    ck_assert(!swap_session_held_elsewhere(d, "conv2", "other"));
    /* Once the image is gone (read back, discarded) the id is free again. */
    swap_session_discard(d, &key);
    ck_assert(!swap_session_held_elsewhere(d, "conv", "other"));
    swap_dir_destroy(&d);

    /* An image renamed to another's name is not believed: its name is not the hash of what it
     * says it holds. */
    ck_assert_int_eq(swap_session_write(d = swap_dir_open(dir, 3600000, NULL), &key, kv, ids, 8,
                                        &err),
                     CORRAL_OK);
    char path[512], moved[600];
    only_image(path, sizeof path);
    snprintf(moved, sizeof moved, "%s/session-0123456789abcdef.gguf", dir);
    ck_assert_int_eq(rename(path, moved), 0);
    swap_dir_destroy(&d);
    d = swap_dir_open(dir, 3600000, NULL);
    ck_assert(!swap_session_held_elsewhere(d, "conv", "other"));
    swap_dir_destroy(&d);

    /* Past the time-to-live an unclaimed image is expired, not held. */
    unlink(moved);
    d = swap_dir_open(dir, 3600000, NULL);
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 8, &err), CORRAL_OK);
    swap_dir_destroy(&d);
    d = swap_dir_open(dir, 1000, NULL);
    only_image(path, sizeof path);
    struct timespec old[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    ck_assert(!swap_session_held_elsewhere(d, "conv", "other"));
    ck_assert_int_eq(access(path, F_OK), -1); /* and deleted */
    swap_dir_destroy(&d);
    kv_cache_destroy(&kv);
}
END_TEST

/* Write an image, damage it with `damage`, and expect the read to fail and delete it. */
static void expect_refused(void (*damage)(const char *path), swap_session_key read_key,
                           const char *want) {
    swap_dir *d = swap_dir_open(dir, 3600000, NULL);
    int32_t ids[10];
    kv_cache *kv = filled_cache(ids, 10);
    swap_session_key key = key_for("conv-2", 64);
    corral_error err;
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 10, &err), CORRAL_OK);
    if (damage) {
        char path[256];
        only_image(path, sizeof path);
        damage(path);
    }
    kv_cache *back = kv_cache_new(m, read_key.context, KV_TYPE_F16, &err);
    int32_t *tokens = NULL;
    uint32_t n = 99;
    ck_assert_int_ne(swap_session_read(d, &read_key, back, &tokens, &n, &err), CORRAL_OK);
    ck_assert_msg(strstr(err.message, want) != NULL, "'%s' lacks '%s'", err.message, want);
    ck_assert_ptr_null(tokens);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(kv_cache_n_pos(back), 0);
    ck_assert_int_eq(count_files("session-"), 0); /* deleted */
    kv_cache_destroy(&kv);
    kv_cache_destroy(&back);
    swap_dir_destroy(&d);
}

static void flip_tail(const char *path) {
    FILE *fp = fopen(path, "r+b");
    fseek(fp, -5, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -5, SEEK_END);
    fputc(c ^ 0xff, fp);
    fclose(fp);
}

static void truncate_half(const char *path) {
    struct stat st;
    stat(path, &st);
    ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
}

START_TEST(test_corrupt_and_stale_images_refused) {
    expect_refused(flip_tail, key_for("conv-2", 64), "checksum");
    expect_refused(truncate_half, key_for("conv-2", 64), "");
    /* Another context: the fingerprint no longer matches. */
    expect_refused(NULL, key_for("conv-2", 32), "fingerprint");
    /* A model loaded from another file (or from this one changed): its caches are other ones. */
    swap_session_key other = key_for("conv-2", 64);
    other.model_fingerprint = "0123456789abcdef";
    expect_refused(NULL, other, "fingerprint");
}
END_TEST

START_TEST(test_no_model_fingerprint_keeps_nothing) {
    swap_dir *d = swap_dir_open(dir, 3600000, NULL);
    int32_t ids[4];
    kv_cache *kv = filled_cache(ids, 4);
    swap_session_key key = key_for("conv-3", 64);
    key.model_fingerprint = "";
    corral_error err;
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 4, &err), CORRAL_FAILED_PRECONDITION);
    ck_assert_msg(strstr(err.message, "fingerprint"), "%s", err.message);
    ck_assert_int_eq(count_files("session-"), 0);
    kv_cache_destroy(&kv);
    swap_dir_destroy(&d);
}
END_TEST

START_TEST(test_open_cleans_the_directory) {
    swap_dir *d = swap_dir_open(dir, 3600000, NULL);
    int32_t ids[8];
    kv_cache *kv = filled_cache(ids, 8);
    corral_error err;
    swap_session_key good = key_for("good", 64), bad = key_for("bad", 64);
    /* "bad" first, alone, so that its file is easy to find and damage. */
    ck_assert_int_eq(swap_session_write(d, &bad, kv, ids, 8, &err), CORRAL_OK);
    char bad_path[256];
    only_image(bad_path, sizeof bad_path);
    flip_tail(bad_path);
    ck_assert_int_eq(swap_session_write(d, &good, kv, ids, 8, &err), CORRAL_OK);
    swap_dir_destroy(&d);
    /* What a write killed half-way leaves behind. */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "cd %s && echo partial > session-0000000000000000.gguf.part.99 && "
             "echo partial > session-1111111111111111.gguf.tmp.12",
             dir);
    ck_assert_int_eq(system(cmd), 0);

    swap_scan_report rep;
    d = swap_dir_open(dir, 3600000, &rep);
    ck_assert_uint_eq(rep.temp_removed, 2);
    ck_assert_uint_eq(rep.images_removed, 1);
    ck_assert_uint_eq(rep.images_kept, 1);
    ck_assert(swap_session_exists(d, &good));
    ck_assert(!swap_session_exists(d, &bad));
    swap_dir_destroy(&d);
    /* Images older than the session time-to-live go too. */
    d = swap_dir_open(dir, -1, &rep);
    ck_assert_uint_eq(rep.images_removed, 1);
    ck_assert_uint_eq(rep.images_kept, 0);
    swap_dir_destroy(&d);
    kv_cache_destroy(&kv);
}
END_TEST

/* A swap_dir whose parents are missing is made, parents and all, private to its user. */
START_TEST(test_missing_parents_created) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s/state/corral/swap", dir);
    swap_dir *d = swap_dir_open(sub, 1000, NULL);
    ck_assert_ptr_nonnull(d);
    ck_assert(swap_dir_writable(d));
    struct stat st;
    ck_assert_int_eq(stat(sub, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    snprintf(sub, sizeof sub, "%s/state", dir);
    ck_assert_int_eq(stat(sub, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    swap_dir_destroy(&d);
}
END_TEST

START_TEST(test_unwritable_directory) {
    char file[128], sub[160];
    snprintf(file, sizeof file, "%s/a-file", dir);
    FILE *fp = fopen(file, "w");
    fclose(fp);
    snprintf(sub, sizeof sub, "%s/swap", file);
    swap_dir *d = swap_dir_open(sub, 1000, NULL);
    ck_assert_ptr_nonnull(d);
    ck_assert(!swap_dir_writable(d));
    int32_t ids[4];
    kv_cache *kv = filled_cache(ids, 4);
    swap_session_key key = key_for("x", 64);
    corral_error err;
    ck_assert_int_eq(swap_session_write(d, &key, kv, ids, 4, &err), CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "not writable"));
    kv_cache_destroy(&kv);
    swap_dir_destroy(&d);
}
END_TEST

static Suite *swap_suite(void) {
    Suite *s = suite_create("swap");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_round_trip);
    tcase_add_test(core, test_open_cleans_the_directory);
    tcase_add_test(core, test_missing_parents_created);
    tcase_add_test(core, test_images_of_an_earlier_run_keep_their_owner);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_corrupt_and_stale_images_refused);
    tcase_add_test(errors, test_no_model_fingerprint_keeps_nothing);
    tcase_add_test(errors, test_unwritable_directory);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(swap_suite)
