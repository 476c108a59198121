/*
 * test_image.c — Check suite for corral images (engine/include/corral/image.h): the hash (XXH3)
 * against xxHash's published values, fingerprints of files and parameters, writing and
 * verified reading, every kind of stale or corrupt image reported as such, and LRU trimming of
 * image directories.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/bench.h"
#include "corral/gguf.h"
#include "corral/image.h"
#include "corral/tensor.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static char tmp_dir[] = "/tmp/corral-test-image-XXXXXX";

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-image-XXXXXX");
}

static const char *tmp_path(const char *name) {
    static char path[4][512];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) n++;
    }
    closedir(d);
    return n;
}

/* ---- XXH3 ---------------------------------------------------------------------------------- */

/* The reference library's own self-test buffer: byte i is the top byte of a 64-bit generator
 * that starts at PRIME32_1 and is multiplied by PRIME64_1 after each byte. */
static void sanity_buffer(uint8_t *buf, size_t n) {
    uint64_t g = 2654435761u;
    for (size_t i = 0; i < n; i++) {
        buf[i] = (uint8_t)(g >> 56);
        g *= 11400714785074694797ull;
    }
}

START_TEST(test_hash64_is_xxh3) {
    /* XXH3_64bits_withSeed over the sanity buffer, for seeds 0 and PRIME64_1: the values xxHash
     * publishes for its self-test (xxhsum's sanity check), one per length class of the algorithm
     * (1-3, 4-8, 9-16, 17-32, 33-64, 65-96, 129-240 bytes; one block with an overlapping last
     * stripe; whole blocks; three blocks and a partial stripe). */
    static const struct {
        size_t n;
        uint64_t seed0, seed_p;
    } vectors[] = {
        {0, 0x2D06800538D394C2ull, 0xA8A6B918B2F0364Aull},
        {1, 0xC44BDFF4074EECDBull, 0x032BE332DD766EF8ull},
        {6, 0x27B56A84CD2D7325ull, 0x84589C116AB59AB9ull},
        {12, 0xA713DAF0DFBB77E7ull, 0xE7303E1B2336DE0Eull},
        {24, 0xA3FE70BF9D3510EBull, 0x850E80FC35BDD690ull},
        {48, 0x397DA259ECBA1F11ull, 0xADC2CBAA44ACC616ull},
        {80, 0xBCDEFBBB2C47C90Aull, 0xC6DD0CB699532E73ull},
        {195, 0xCD94217EE362EC3Aull, 0xBA68003D370CB3D9ull},
        {403, 0xCDEB804D65C6DEA4ull, 0x6259F6ECFD6443FDull},
        {512, 0x617E49599013CB6Bull, 0x3CE457DE14C27708ull},
        {2048, 0xDD59E2C3A5F038E0ull, 0x66F81670669ABABCull},
        {2240, 0x6E73A90539CF2948ull, 0x757BA8487D1B5247ull},
        {2367, 0xCB37AEB9E5D361EDull, 0xD2DB3415B942B42Aull},
    };
    const uint64_t prime64 = 11400714785074694797ull;
    uint8_t buf[2367];
    sanity_buffer(buf, sizeof buf);
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        ck_assert_msg(image_hash64(buf, vectors[i].n, 0) == vectors[i].seed0, "n=%zu seed 0",
                      vectors[i].n);
        ck_assert_msg(image_hash64(buf, vectors[i].n, prime64) == vectors[i].seed_p,
                      "n=%zu seed PRIME64", vectors[i].n);
    }
    /* Unaligned input gives the same value as aligned. */
    uint8_t shifted[2049];
    memcpy(shifted + 1, buf, 2048);
    ck_assert(image_hash64(shifted + 1, 2048, 0) == 0xDD59E2C3A5F038E0ull);
}
END_TEST

/* ---- fingerprints -------------------------------------------------------------------------- */

/* File systems stamp change times from a coarse clock (a few milliseconds): sleep long enough
 * that a change made now gets a change time of its own. */
static void let_the_clock_tick(void) {
    const struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

static void fp_hex_of_file(const char *path, char out[IMAGE_FINGERPRINT_CHARS + 1]) {
    image_fingerprint fp;
    image_fingerprint_init(&fp, "test");
    corral_error err;
    ck_assert_int_eq(image_fingerprint_add_file(&fp, path, &err), CORRAL_OK);
    image_fingerprint_hex(&fp, out);
}

START_TEST(test_fingerprint_items_are_delimited) {
    image_fingerprint a, b;
    image_fingerprint_init(&a, "d");
    image_fingerprint_init(&b, "d");
    image_fingerprint_add_str(&a, "ab");
    image_fingerprint_add_str(&a, "c");
    image_fingerprint_add_str(&b, "a");
    image_fingerprint_add_str(&b, "bc");
    ck_assert(a.state != b.state);
    /* A domain separates purposes; a float differs by its bits; NULL is not "". */
    image_fingerprint c, d;
    image_fingerprint_init(&c, "d1");
    image_fingerprint_init(&d, "d2");
    ck_assert(c.state != d.state);
    image_fingerprint_add_f32(&c, 0.5f);
    image_fingerprint_init(&d, "d1");
    image_fingerprint_add_f32(&d, 0.50000006f);
    ck_assert(c.state != d.state);
    image_fingerprint_init(&c, "d1");
    image_fingerprint_init(&d, "d1");
    image_fingerprint_add_str(&c, NULL);
    image_fingerprint_add_str(&d, "");
    ck_assert(c.state != d.state);
    char hex[IMAGE_FINGERPRINT_CHARS + 1];
    image_fingerprint_hex(&c, hex);
    ck_assert_uint_eq(strlen(hex), 16);
    ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), 16);
}
END_TEST

START_TEST(test_fingerprint_of_file_tracks_identity) {
    /* 200 KiB: larger than both 64 KiB edges together, so a middle byte is outside them. */
    size_t n = 200 * 1024;
    uint8_t *data = malloc(n);
    sanity_buffer(data, n);
    const char *path = tmp_path("input.bin");
    write_file(path, data, n);
    struct timespec when[2] = {{1700000000, 0}, {1700000000, 123456789}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    char a[17], b[17], c[17];
    fp_hex_of_file(path, a);
    fp_hex_of_file(path, b);
    ck_assert_str_eq(a, b); /* deterministic */

    /* Same size and mtime, a byte changed in the last 64 KiB: the tail hash sees it. */
    data[n - 10] ^= 1;
    write_file(path, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    /* The same bytes written again, the times put back: the change time still moved. */
    let_the_clock_tick();
    data[n - 10] ^= 1;
    write_file(path, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    /* From here on, a is the file as it is, and each change below is the only one. */
    fp_hex_of_file(path, a);
    /* A byte in the middle, outside both edges, with size and times put back. */
    let_the_clock_tick();
    data[n / 2] ^= 1;
    write_file(path, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    fp_hex_of_file(path, a);
    /* Only the mtime changes (by one nanosecond). */
    when[1].tv_nsec++;
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    /* The size changes. */
    write_file(path, data, n - 1);
    when[1].tv_nsec--;
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    /* Replaced by a copy (same bytes, size and times: another inode). */
    write_file(path, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(path, a);
    const char *copy = tmp_path("copy.bin");
    write_file(copy, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, copy, when, 0), 0);
    ck_assert_int_eq(rename(copy, path), 0);
    fp_hex_of_file(path, c);
    ck_assert_str_ne(a, c);
    /* The same bytes at another path. */
    const char *other = tmp_path("other.bin");
    write_file(other, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, other, when, 0), 0);
    write_file(path, data, n);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    fp_hex_of_file(other, c);
    ck_assert_str_ne(a, c);
    fp_hex_of_file(path, a);
    /* A relative spelling of the same file is the same file. */
    char cwd[512];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(tmp_dir), 0);
    fp_hex_of_file("./input.bin", c);
    ck_assert_int_eq(chdir(cwd), 0);
    ck_assert_str_eq(a, c);
    /* Missing files are errors naming the path, and leave the fingerprint alone. */
    image_fingerprint fp;
    image_fingerprint_init(&fp, "test");
    uint64_t before = fp.state;
    corral_error err;
    ck_assert_int_eq(image_fingerprint_add_file(&fp, tmp_path("nope.bin"), &err), CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "nope.bin"));
    ck_assert(fp.state == before);
    free(data);
}
END_TEST

/* ---- writing and reading ------------------------------------------------------------------- */

#define FP_A "0123456789abcdef"
#define FP_B "fedcba9876543210"

static float tensor_a[64 * 4];
static uint8_t tensor_c[2 * 34]; /* two Q8_0 blocks */

static corral_status fill_b(void *user, const char *name, void *dst, uint64_t size,
                            corral_error *err) {
    (void)user;
    (void)name;
    (void)err;
    for (uint64_t i = 0; i < size / 4; i++) ((float *)dst)[i] = (float)i * 0.25f - 3.0f;
    return CORRAL_OK;
}

static corral_status fill_fails(void *user, const char *name, void *dst, uint64_t size,
                                corral_error *err) {
    (void)user;
    (void)dst;
    (void)size;
    return corral_error_set(err, CORRAL_IO, "tensor '%s': the source went away", name);
}

/* Writes a three-tensor image of kind "test-kind": one tensor from memory, one filled, one Q8_0
 * from memory. */
static void write_test_image(const char *path, const char *kind, const char *fp) {
    for (int i = 0; i < 64 * 4; i++) tensor_a[i] = (float)(i % 17) - 8.0f;
    float src[64];
    for (int i = 0; i < 64; i++) src[i] = (float)i / 10.0f;
    tensor_type_get_traits(TENSOR_TYPE_Q8_0)->from_float(src, tensor_c, 64);
    corral_error err;
    image_writer *w = image_writer_new(kind, fp, &err);
    ck_assert_msg(w != NULL, "%s", err.message);
    gguf_builder *b = image_writer_builder(w);
    ck_assert_int_eq(gguf_builder_set_str(b, "general.name", "image test"), CORRAL_OK);
    int64_t ne_a[2] = {64, 4}, ne_b[1] = {100}, ne_c[1] = {64};
    ck_assert_int_eq(image_writer_add_tensor(w, "a", TENSOR_TYPE_F32, 2, ne_a, tensor_a, &err),
                     CORRAL_OK);
    ck_assert_int_eq(
        image_writer_add_tensor_fill(w, "b", TENSOR_TYPE_F32, 1, ne_b, fill_b, NULL, &err),
        CORRAL_OK);
    ck_assert_int_eq(image_writer_add_tensor(w, "c", TENSOR_TYPE_Q8_0, 1, ne_c, tensor_c, &err),
                     CORRAL_OK);
    ck_assert_msg(image_writer_write(w, path, &err) == CORRAL_OK, "%s", err.message);
    image_writer_destroy(&w);
    ck_assert_ptr_null(w);
}

START_TEST(test_fingerprint_of_an_image_survives_its_touch) {
    /* image_touch (every use) moves the change time; an image's fingerprint leaves it out, so
     * that images made from an image (repacked weights of a merged model) stay valid. */
    const char *path = tmp_path("touched.gguf");
    write_test_image(path, "test-kind", FP_A);
    char a[17], b[17];
    fp_hex_of_file(path, a);
    let_the_clock_tick();
    corral_error err;
    ck_assert_int_eq(image_touch(path, &err), CORRAL_OK);
    fp_hex_of_file(path, b);
    ck_assert_str_eq(a, b);
    /* A plain file touched the same way does change. */
    const char *plain = tmp_path("plain.bin");
    write_file(plain, "not an image", 12);
    fp_hex_of_file(plain, a);
    let_the_clock_tick();
    ck_assert_int_eq(image_touch(plain, &err), CORRAL_OK);
    fp_hex_of_file(plain, b);
    ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(test_file_stamp_tells_modified_from_replaced) {
    const char *path = tmp_path("stamped.bin");
    write_file(path, "0123456789", 10);
    image_file_stamp s;
    corral_error err;
    ck_assert_int_eq(image_file_stamp_read(path, &s, &err), CORRAL_OK);
    char why[256];
    ck_assert_int_eq(image_file_stamp_compare(&s, path, why, sizeof why), IMAGE_FILE_SAME);
    ck_assert_str_eq(why, "");
    /* Truncated in place: the same inode, another size. */
    ck_assert_int_eq(truncate(path, 5), 0);
    ck_assert_int_eq(image_file_stamp_compare(&s, path, why, sizeof why), IMAGE_FILE_MODIFIED);
    ck_assert_ptr_nonnull(strstr(why, "size 10 -> 5 bytes"));
    /* Rewritten in place with the same size and modification time: the change time tells. */
    write_file(path, "0123456789", 10);
    const struct timespec when[2] = {{1700000000, 0}, {1700000000, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    ck_assert_int_eq(image_file_stamp_read(path, &s, &err), CORRAL_OK);
    let_the_clock_tick();
    write_file(path, "9876543210", 10);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
    ck_assert_int_eq(image_file_stamp_compare(&s, path, why, sizeof why), IMAGE_FILE_MODIFIED);
    ck_assert_ptr_nonnull(strstr(why, "change time"));
    /* Replaced at its path: another inode. */
    ck_assert_int_eq(image_file_stamp_read(path, &s, &err), CORRAL_OK);
    const char *other = tmp_path("other-stamped.bin");
    write_file(other, "9876543210", 10);
    ck_assert_int_eq(rename(other, path), 0);
    ck_assert_int_eq(image_file_stamp_compare(&s, path, why, sizeof why), IMAGE_FILE_REPLACED);
    ck_assert_ptr_nonnull(strstr(why, "replaced by another file"));
    /* Gone. */
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(image_file_stamp_compare(&s, path, NULL, 0), IMAGE_FILE_REPLACED);
    ck_assert_int_eq(image_file_stamp_read(path, &s, &err), CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "stamped.bin"));
}
END_TEST

START_TEST(test_write_open_verify) {
    const char *path = tmp_path("img.gguf");
    write_test_image(path, "test-kind", FP_A);
    ck_assert_int_eq(count_entries(tmp_dir), 1); /* no temporaries left */
    corral_error err;
    image_problem problem = IMAGE_PROBLEM_COUNT;
    image *im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_FULL, &problem, &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    ck_assert_int_eq(problem, IMAGE_PROBLEM_NONE);
    ck_assert_str_eq(image_get_kind(im), "test-kind");
    ck_assert_str_eq(image_get_fingerprint(im), FP_A);
    const gguf_file *f = image_gguf(im);
    ck_assert_uint_eq(gguf_tensor_count(f), 3);
    /* The stored checksums are XXH3 (seed 0) of exactly each tensor's bytes. */
    for (uint64_t i = 0; i < 3; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert(image_tensor_checksum(im, i) == image_hash64(t->data, t->size, 0));
        ck_assert_int_eq(image_verify_tensor(im, i, &problem, &err), CORRAL_OK);
    }
    const gguf_tensor *a = gguf_find_tensor(f, "a"), *b = gguf_find_tensor(f, "b");
    ck_assert(memcmp(a->data, tensor_a, sizeof tensor_a) == 0);
    ck_assert(((const float *)b->data)[99] == 99 * 0.25f - 3.0f);
    gguf_str name;
    ck_assert_int_eq(gguf_get_str(f, "general.name", &name, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(name, "image test"));
    ck_assert_int_eq(image_verify_tensor(im, 3, &problem, &err), CORRAL_INVALID_ARGUMENT);
    image_destroy(&im);
    ck_assert_ptr_null(im);
    image_destroy(&im); /* NULL-safe */
    /* Kind and fingerprint are optional checks. */
    im = image_open(path, NULL, NULL, IMAGE_VERIFY_METADATA, &problem, &err);
    ck_assert_ptr_nonnull(im);
    image_destroy(&im);
}
END_TEST

/* The writer lets the image's pages go once they are on disk, so that the first reader reads
 * the file afresh (and the kernel can map it in 2 MiB pages). Checked where the file system
 * drops clean pages on request at all (tmpfs, for one, cannot): a plain file written, synced and
 * dropped the same way is the control. */
START_TEST(test_written_image_leaves_page_cache) {
    static uint8_t bytes[1 << 20];
    memset(bytes, 0x5a, sizeof bytes);
    const char *control = tmp_path("control.bin");
    write_file(control, bytes, sizeof bytes);
    int fd = open(control, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fsync(fd), 0);
    ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    const bool fs_drops = bench_cached_fraction(control) == 0;

    const char *path = tmp_path("img.gguf");
    corral_error err;
    image_writer *w = image_writer_new("test-kind", FP_A, &err);
    ck_assert_ptr_nonnull(w);
    const int64_t ne[1] = {sizeof bytes};
    ck_assert_int_eq(image_writer_add_tensor(w, "bytes", TENSOR_TYPE_I8, 1, ne, bytes, &err),
                     CORRAL_OK);
    ck_assert_msg(image_writer_write(w, path, &err) == CORRAL_OK, "%s", err.message);
    image_writer_destroy(&w);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_gt(sb.st_size, 256 * 4096);
    const double cached = bench_cached_fraction(path);
    if (fs_drops)
        ck_assert_msg(cached == 0, "%.0f%% of the pages of a written image still cached",
                      100.0 * cached);
    else
        fprintf(stderr, "test_written_image_leaves_page_cache: this file system keeps clean "
                        "pages; only the image's contents are checked\n");
    image_problem problem;
    image *im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_FULL, &problem, &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    const gguf_tensor *t = gguf_find_tensor(image_gguf(im), "bytes");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, bytes, sizeof bytes), 0);
    image_destroy(&im);
}
END_TEST

/* Flips one byte of the file at offset off. */
static void flip_byte(const char *path, uint64_t off) {
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t c;
    ck_assert_int_eq(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

START_TEST(test_flipped_byte_is_a_checksum_mismatch) {
    const char *path = tmp_path("img.gguf");
    write_test_image(path, "test-kind", FP_A);
    corral_error err;
    image *im = image_open(path, NULL, NULL, IMAGE_VERIFY_FULL, NULL, &err);
    ck_assert_ptr_nonnull(im);
    const gguf_file *f = image_gguf(im);
    const gguf_tensor *b = gguf_find_tensor(f, "b");
    uint64_t off = (uint64_t)((const uint8_t *)b->data - (const uint8_t *)gguf_file_data(f)) + 17;
    image_destroy(&im);
    flip_byte(path, off);

    image_problem problem;
    im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_FULL, &problem, &err);
    ck_assert_ptr_null(im);
    ck_assert_int_eq(problem, IMAGE_PROBLEM_CHECKSUM);
    ck_assert_int_eq(err.status, CORRAL_FORMAT);
    ck_assert_msg(strstr(err.message, "checksum mismatch") && strstr(err.message, "'b'") &&
                      strstr(err.message, "corrupt"),
                  "%s", err.message);
    /* Metadata verification opens it; per-tensor verification finds exactly tensor b. */
    im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_METADATA, &problem, &err);
    ck_assert_ptr_nonnull(im);
    f = image_gguf(im);
    for (uint64_t i = 0; i < 3; i++) {
        corral_status st = image_verify_tensor(im, i, &problem, &err);
        int is_b = gguf_str_eq(gguf_tensor_at(f, i)->name, "b");
        ck_assert_int_eq(st, is_b ? CORRAL_FORMAT : CORRAL_OK);
        ck_assert_int_eq(problem, is_b ? IMAGE_PROBLEM_CHECKSUM : IMAGE_PROBLEM_NONE);
    }
    ck_assert_int_eq(image_verify_all(im, &problem, &err), CORRAL_FORMAT);
    ck_assert_int_eq(problem, IMAGE_PROBLEM_CHECKSUM);
    image_destroy(&im);
}
END_TEST

START_TEST(test_truncated_is_malformed) {
    const char *path = tmp_path("img.gguf");
    write_test_image(path, "test-kind", FP_A);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(truncate(path, sb.st_size - 40), 0);
    corral_error err;
    image_problem problem;
    image *im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_METADATA, &problem, &err);
    ck_assert_ptr_null(im);
    ck_assert_int_eq(problem, IMAGE_PROBLEM_MALFORMED);
    ck_assert_int_eq(err.status, CORRAL_FORMAT);
    ck_assert_msg(strstr(err.message, "malformed") && strstr(err.message, "past end"), "%s",
                  err.message);
}
END_TEST

START_TEST(test_wrong_fingerprint_kind_version) {
    const char *path = tmp_path("img.gguf");
    write_test_image(path, "test-kind", FP_A);
    corral_error err;
    image_problem problem;
    ck_assert_ptr_null(image_open(path, "test-kind", FP_B, IMAGE_VERIFY_FULL, &problem, &err));
    ck_assert_int_eq(problem, IMAGE_PROBLEM_FINGERPRINT);
    ck_assert_int_eq(err.status, CORRAL_FAILED_PRECONDITION);
    ck_assert_msg(strstr(err.message, "stale fingerprint") && strstr(err.message, FP_A) &&
                      strstr(err.message, FP_B),
                  "%s", err.message);
    ck_assert_ptr_null(image_open(path, "other-kind", FP_A, IMAGE_VERIFY_FULL, &problem, &err));
    ck_assert_int_eq(problem, IMAGE_PROBLEM_KIND);
    ck_assert_msg(strstr(err.message, "wrong kind") && strstr(err.message, "other-kind"), "%s",
                  err.message);

    /* An image of another format version, built by hand: version 1 (XXH64 checksums) is what
     * corral wrote before it took XXH3; such an image is made again, never read. */
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_set_u32(b, IMAGE_KEY_VERSION, 1), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, IMAGE_KEY_KIND, "test-kind"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, IMAGE_KEY_FINGERPRINT, FP_A), CORRAL_OK);
    const char *v1 = tmp_path("v1.gguf");
    ck_assert_int_eq(gguf_builder_write(b, v1, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    ck_assert_ptr_null(image_open(v1, "test-kind", FP_A, IMAGE_VERIFY_FULL, &problem, &err));
    ck_assert_int_eq(problem, IMAGE_PROBLEM_VERSION);
    ck_assert_int_eq(err.status, CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "wrong version") && strstr(err.message, "version 1"), "%s",
                  err.message);

    /* A plain GGUF file is not an image; a missing one is missing. */
    ck_assert_ptr_null(image_open(test_shared_path("models/stories260K.gguf"), NULL, NULL,
                                  IMAGE_VERIFY_METADATA, &problem, &err));
    ck_assert_int_eq(problem, IMAGE_PROBLEM_NOT_IMAGE);
    ck_assert_ptr_nonnull(strstr(err.message, "not a corral image"));
    ck_assert_ptr_null(
        image_open(tmp_path("absent.gguf"), NULL, NULL, IMAGE_VERIFY_FULL, &problem, &err));
    ck_assert_int_eq(problem, IMAGE_PROBLEM_MISSING);
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
    ck_assert_str_eq(image_problem_name(IMAGE_PROBLEM_CHECKSUM), "checksum mismatch");
    ck_assert_str_eq(image_problem_name(IMAGE_PROBLEM_COUNT), "?");
}
END_TEST

START_TEST(test_failed_write_leaves_nothing) {
    const char *path = tmp_path("img.gguf");
    write_test_image(path, "test-kind", FP_A);
    struct stat before;
    ck_assert_int_eq(stat(path, &before), 0);
    corral_error err;
    image_writer *w = image_writer_new("test-kind", FP_B, &err);
    int64_t ne[1] = {32};
    ck_assert_int_eq(
        image_writer_add_tensor_fill(w, "x", TENSOR_TYPE_F32, 1, ne, fill_fails, NULL, &err),
        CORRAL_OK);
    ck_assert_int_eq(image_writer_write(w, path, &err), CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "went away"));
    image_writer_destroy(&w);
    /* The old image is intact and nothing else was left behind. */
    ck_assert_int_eq(count_entries(tmp_dir), 1);
    image *im = image_open(path, "test-kind", FP_A, IMAGE_VERIFY_FULL, NULL, &err);
    ck_assert_ptr_nonnull(im);
    image_destroy(&im);
    /* Bad writer arguments. */
    ck_assert_ptr_null(image_writer_new("", FP_A, &err));
    ck_assert_ptr_null(image_writer_new("k", "0123", &err));
    ck_assert_ptr_null(image_writer_new("k", "0123456789ABCDEF", &err)); /* upper case */
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_empty_image) {
    const char *path = tmp_path("empty.gguf");
    corral_error err;
    image_writer *w = image_writer_new("state", FP_A, &err);
    ck_assert_int_eq(image_writer_write(w, path, &err), CORRAL_OK);
    ck_assert_int_eq(image_writer_write(w, path, &err), CORRAL_INVALID_ARGUMENT); /* once only */
    image_writer_destroy(&w);
    image *im = image_open(path, "state", FP_A, IMAGE_VERIFY_FULL, NULL, &err);
    ck_assert_msg(im != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_tensor_count(image_gguf(im)), 0);
    image_destroy(&im);
}
END_TEST

/* ---- trimming ------------------------------------------------------------------------------ */

static void make_aged(const char *name, size_t bytes, time_t mtime) {
    const char *path = tmp_path(name);
    char *zeros = calloc(1, bytes ? bytes : 1);
    write_file(path, zeros, bytes);
    free(zeros);
    struct timespec when[2] = {{mtime, 0}, {mtime, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
}

static int exists(const char *name) {
    struct stat sb;
    return stat(tmp_path(name), &sb) == 0;
}

START_TEST(test_trim_lru_by_use_time) {
    time_t now = time(NULL);
    make_aged("lora-a.gguf", 1000, now - 400); /* oldest */
    make_aged("lora-b.gguf", 1000, now - 300);
    make_aged("lora-c.gguf", 1000, now - 200);
    make_aged("lora-d.gguf", 1000, now - 100);       /* newest */
    make_aged("other.gguf", 5000, now - 1000);       /* another prefix: not a candidate */
    make_aged("lora-x.txt", 5000, now - 1000);       /* not .gguf */
    make_aged("lora-e.gguf.part.1", 10, now - 7200); /* a dead write's leftover */
    make_aged("lora-f.gguf.tmp.2", 10, now - 10);    /* a write in progress */
    corral_error err;
    /* Touching a makes it the most recently used, through its access time alone: its mtime (part
     * of fingerprints) does not move. */
    ck_assert_int_eq(image_touch(tmp_path("lora-a.gguf"), &err), CORRAL_OK);
    struct stat sa;
    ck_assert_int_eq(stat(tmp_path("lora-a.gguf"), &sa), 0);
    ck_assert_int_eq(sa.st_mtim.tv_sec, now - 400);
    ck_assert_int_ge(sa.st_atim.tv_sec, now);
    image_trim_report rep;
    ck_assert_int_eq(image_dir_trim(tmp_dir, "lora-", 2500, "lora-b.gguf", &rep, &err), CORRAL_OK);
    /* Over 2500 bytes: c (oldest after b, which is kept) goes, then d; a and b remain. */
    ck_assert(exists("lora-a.gguf"));
    ck_assert(exists("lora-b.gguf"));
    ck_assert(!exists("lora-c.gguf"));
    ck_assert(!exists("lora-d.gguf"));
    ck_assert(exists("other.gguf"));
    ck_assert(exists("lora-x.txt"));
    ck_assert(!exists("lora-e.gguf.part.1"));
    ck_assert(exists("lora-f.gguf.tmp.2"));
    ck_assert_uint_eq(rep.n_kept, 2);
    ck_assert_uint_eq(rep.bytes_kept, 2000);
    ck_assert_uint_eq(rep.n_removed, 3);
    ck_assert_uint_eq(rep.bytes_removed, 2010);
    /* Under the limit nothing goes; a limit of 0 removes everything but `keep`. */
    ck_assert_int_eq(image_dir_trim(tmp_dir, "lora-", 1 << 20, NULL, &rep, &err), CORRAL_OK);
    ck_assert_uint_eq(rep.n_removed, 0);
    ck_assert_int_eq(image_dir_trim(tmp_dir, "lora-", 0, "lora-a.gguf", &rep, &err), CORRAL_OK);
    ck_assert(exists("lora-a.gguf"));
    ck_assert(!exists("lora-b.gguf"));
    ck_assert_int_eq(image_dir_trim(tmp_path("nope"), "lora-", 0, NULL, &rep, &err),
                     CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "nope"));
    ck_assert_int_eq(image_touch(tmp_path("gone.gguf"), &err), CORRAL_NOT_FOUND);
}
END_TEST

START_TEST(test_trim_several_prefixes_share_one_budget) {
    time_t now = time(NULL);
    make_aged("lora-a.gguf", 1000, now - 400);
    make_aged("repack-a.gguf", 1000, now - 300);
    make_aged("lora-b.gguf", 1000, now - 200);
    make_aged("repack-b.gguf", 1000, now - 100);
    make_aged("session-x.gguf", 1000, now - 1000); /* no listed prefix: never a candidate */
    corral_error err;
    image_trim_report rep;
    ck_assert_int_eq(image_dir_trim(tmp_dir, "lora-|repack-", 2000, NULL, &rep, &err), CORRAL_OK);
    /* The two oldest of either kind go; the other prefix's files are untouched. */
    ck_assert(!exists("lora-a.gguf"));
    ck_assert(!exists("repack-a.gguf"));
    ck_assert(exists("lora-b.gguf"));
    ck_assert(exists("repack-b.gguf"));
    ck_assert(exists("session-x.gguf"));
    ck_assert_uint_eq(rep.n_removed, 2);
    /* Empty alternatives match nothing. */
    ck_assert_int_eq(image_dir_trim(tmp_dir, "|", 0, NULL, &rep, &err), CORRAL_OK);
    ck_assert_uint_eq(rep.n_removed, 0);
}
END_TEST

static Suite *image_suite(void) {
    Suite *s = suite_create("image");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, tmp_setup, tmp_teardown);
    tcase_add_test(core, test_hash64_is_xxh3);
    tcase_add_test(core, test_trim_several_prefixes_share_one_budget);
    tcase_add_test(core, test_fingerprint_items_are_delimited);
    tcase_add_test(core, test_fingerprint_of_file_tracks_identity);
    tcase_add_test(core, test_fingerprint_of_an_image_survives_its_touch);
    tcase_add_test(core, test_file_stamp_tells_modified_from_replaced);
    tcase_add_test(core, test_write_open_verify);
    tcase_add_test(core, test_empty_image);
    tcase_add_test(core, test_written_image_leaves_page_cache);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, tmp_setup, tmp_teardown);
    tcase_add_test(limits, test_trim_lru_by_use_time);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, tmp_setup, tmp_teardown);
    tcase_add_test(errors, test_flipped_byte_is_a_checksum_mismatch);
    tcase_add_test(errors, test_truncated_is_malformed);
    tcase_add_test(errors, test_wrong_fingerprint_kind_version);
    tcase_add_test(errors, test_failed_write_leaves_nothing);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(image_suite)
