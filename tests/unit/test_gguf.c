/*
 * test_gguf.c — Check suite for the GGUF reader and writer (engine/include/corral/gguf.h).
 *
 * core:   every shared .gguf opens (legacy v1 is refused), tensor names/types/shapes agree with
 *         models/TENSOR_TYPES.txt, stories260K's known metadata reads back through the typed
 *         getters, the F32 and F16 stories files hold the same weights, and the builder
 *         round-trips every metadata type, nested arrays and tensors of several types.
 * limits: empty files and values, a 200k-entry string array, extreme alignments, deep nesting,
 *         integer conversions at their edges, rendering into small buffers.
 * errors: crafted files, one kind of damage each, must fail with the right status and a message
 *         naming the problem; a fuzz-style pass truncates and corrupts stories260K thousands of
 *         times (the sanitizer build proves no overrun and no leak).
 * Crafted files are written byte by byte by the small `tbuf` writer below, independently of the
 * builder under test, and opened from exactly-sized heap copies so that ASan sees any overread.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/tensor.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static char tmp_dir[256];

/* Unchecked fixture: runs in the parent around each TCase, so cleanup happens even when a test
 * fails in its forked child. */
static void tmp_dir_setup(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/corral-test-gguf-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        abort();
    }
}

static void tmp_dir_teardown(void) {
    DIR *d = opendir(tmp_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmp_dir);
}

static const char *tmp_path(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp_dir, name);
    return p;
}

/* Entries of the temporary folder whose names start with prefix (a written file and any
 * "<file>.tmp.<pid>" left behind). */
static int tmp_count_prefix(const char *prefix) {
    DIR *d = opendir(tmp_dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static uint8_t *read_whole(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)n);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(fread(d, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *size = (size_t)n;
    return d;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng_next(void) { /* xorshift64: fixed seed, reproducible */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A byte writer for crafting files, independent of the builder under test. */
typedef struct tbuf {
    uint8_t *d;
    size_t len, cap;
} tbuf;

static void tb_put(tbuf *t, const void *p, size_t n) {
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2 + 64;
        t->d = realloc(t->d, t->cap);
        ck_assert_ptr_nonnull(t->d);
    }
    if (n) memcpy(t->d + t->len, p, n);
    t->len += n;
}

static void tb_le(tbuf *t, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));
        tb_put(t, &b, 1);
    }
}

static void tb_str(tbuf *t, const char *s) {
    tb_le(t, strlen(s), 8);
    tb_put(t, s, strlen(s));
}

static void tb_header(tbuf *t, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    tb_put(t, "GGUF", 4);
    tb_le(t, version, 4);
    tb_le(t, n_tensors, 8);
    tb_le(t, n_kv, 8);
}

static void tb_key(tbuf *t, const char *key, uint32_t type) {
    tb_str(t, key);
    tb_le(t, type, 4);
}

static void tb_array(tbuf *t, uint32_t elem_type, uint64_t count) {
    tb_le(t, elem_type, 4);
    tb_le(t, count, 8);
}

static void tb_tensor(tbuf *t, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    tb_str(t, name);
    tb_le(t, n_dims, 4);
    for (uint32_t d = 0; d < n_dims; d++) tb_le(t, ne[d], 8);
    tb_le(t, type, 4);
    tb_le(t, offset, 8);
}

static void tb_pad(tbuf *t, uint64_t alignment) {
    while (t->len % alignment) tb_le(t, 0, 1);
}

static void tb_fill(tbuf *t, size_t n) {
    for (size_t i = 0; i < n; i++) tb_le(t, (uint8_t)(i * 7 + 3), 1);
}

static void tb_free(tbuf *t) {
    free(t->d);
    *t = (tbuf){0};
}

/* Opens the first len bytes of t from an exactly-sized heap copy (ASan flags any overread). The
 * copy is returned in *copy and must outlive the handle. */
static gguf_file *open_exact(const tbuf *t, size_t len, void **copy, corral_error *err) {
    *copy = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(*copy);
    if (len) memcpy(*copy, t->d, len);
    return gguf_open_buffer(*copy, len, "crafted.gguf", err);
}

/* The file must be refused with `status` and a message containing `needle` and naming it. */
static void expect_reject_len(const tbuf *t, size_t len, corral_status status, const char *needle) {
    void *copy;
    corral_error err;
    corral_error_clear(&err);
    gguf_file *f = open_exact(t, len, &copy, &err);
    if (f) gguf_destroy(&f);
    free(copy);
    ck_assert_msg(f == NULL, "crafted file accepted, expected '%s'", needle);
    ck_assert_msg(err.status == status, "status %s, expected %s: %s",
                  corral_status_name(err.status), corral_status_name(status), err.message);
    ck_assert_msg(strstr(err.message, needle) != NULL, "message '%s' lacks '%s'", err.message,
                  needle);
    ck_assert_msg(strstr(err.message, "crafted.gguf") != NULL, "message '%s' lacks the name",
                  err.message);
}

static void expect_reject(const tbuf *t, corral_status status, const char *needle) {
    expect_reject_len(t, t->len, status, needle);
}

static void expect_accept(const tbuf *t) {
    void *copy;
    corral_error err;
    gguf_file *f = open_exact(t, t->len, &copy, &err);
    ck_assert_msg(f != NULL, "crafted file refused: %s", err.message);
    gguf_destroy(&f);
    ck_assert_ptr_null(f);
    free(copy);
}

/* A small valid file (version 3, 4 keys, 2 F32 tensors), with offsets inside its parts. */
typedef struct craft_marks {
    size_t in_header, in_key, in_array, in_infos, data, in_data;
} craft_marks;

static void craft_valid(tbuf *t, craft_marks *m) {
    tb_header(t, 3, 2, 4);
    m->in_header = 12; /* inside n_tensors */
    tb_key(t, "general.architecture", GGUF_TYPE_STRING);
    tb_str(t, "llama");
    tb_key(t, "test.flags", GGUF_TYPE_ARRAY);
    tb_array(t, GGUF_TYPE_BOOL, 3);
    tb_le(t, 1, 1);
    tb_le(t, 0, 1);
    tb_le(t, 1, 1);
    tb_key(t, "test.names", GGUF_TYPE_ARRAY);
    tb_array(t, GGUF_TYPE_STRING, 3);
    m->in_array = t->len + 9 + 10 + 8 + 1; /* inside the bytes of the third string */
    tb_str(t, "a");
    tb_str(t, "bb");
    tb_str(t, "ccc");
    /* Cuts are made late enough that the bytes left could still hold the declared counts, so
     * that the read itself (not the up-front count check) finds the truncation. */
    m->in_key = t->len + 8 + 5;
    tb_key(t, "general.alignment", GGUF_TYPE_UINT32);
    tb_le(t, 32, 4);
    m->in_infos = t->len + 8 + 3 + 2; /* inside the first tensor's n_dims */
    tb_tensor(t, "tok", 1, (uint64_t[]){8}, TENSOR_TYPE_F32, 0);
    tb_tensor(t, "out", 2, (uint64_t[]){4, 2}, TENSOR_TYPE_F32, 32);
    tb_pad(t, 32);
    m->data = t->len;
    m->in_data = t->len + 40; /* inside "out" */
    tb_fill(t, 64);
}

/* A file whose only content is the given tensor infos (plus an optional general.alignment),
 * followed by `data_bytes` of data. */
typedef struct tinfo {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} tinfo;

static void craft_tensors(tbuf *t, const tinfo *infos, size_t n, uint32_t alignment,
                          size_t data_bytes) {
    tb_header(t, 3, n, alignment ? 1 : 0);
    if (alignment) {
        tb_key(t, "general.alignment", GGUF_TYPE_UINT32);
        tb_le(t, alignment, 4);
    }
    for (size_t i = 0; i < n; i++) {
        tb_tensor(t, infos[i].name, infos[i].n_dims, infos[i].ne, infos[i].type, infos[i].offset);
    }
    if (n > 0) tb_pad(t, alignment ? alignment : GGUF_DEFAULT_ALIGNMENT);
    tb_fill(t, data_bytes);
}

/* ---- core ---------------------------------------------------------------------------------- */

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Structural facts every valid file must have, checked through the public accessors. */
static void check_file_invariants(const gguf_file *f) {
    uint32_t v = gguf_version(f);
    ck_assert(v == 2 || v == 3);
    uint32_t a = gguf_alignment(f);
    ck_assert(a != 0 && (a & (a - 1)) == 0);
    uint64_t size = gguf_file_size(f), data = gguf_data_offset(f);
    ck_assert_uint_le(data, size);
    const uint8_t *base = gguf_file_data(f);
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        gguf_str key = gguf_kv_key(f, i);
        char name[512];
        ck_assert_uint_lt(key.len, sizeof name);
        memcpy(name, key.data, key.len);
        name[key.len] = '\0';
        ck_assert_int_eq(gguf_find_key(f, name), (int64_t)i);
        char text[256];
        size_t n = gguf_format_value(f, i, text, sizeof text);
        ck_assert_uint_eq(n, strlen(text));
    }
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert_uint_eq(data % a, 0);
        const tensor_type_traits *tt = tensor_type_get_traits(t->type);
        ck_assert_ptr_nonnull(tt);
        uint64_t bytes = (uint64_t)(t->ne[0] / tt->block_size) * tt->type_size;
        for (int d = 1; d < GGUF_MAX_DIMS; d++) bytes *= (uint64_t)t->ne[d];
        ck_assert_uint_eq(t->size, bytes);
        ck_assert_ptr_eq(t->data, base + data + t->offset);
        ck_assert_uint_le(data + t->offset + t->size, size);
        ck_assert_uint_eq(t->offset % a, 0);
        char name[512];
        ck_assert_uint_lt(t->name.len, sizeof name);
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = '\0';
        ck_assert_ptr_eq(gguf_find_tensor(f, name), t);
    }
}

START_TEST(test_open_every_shared_file) {
    const char *dirs[] = {"models", "lora", "vocab"};
    int opened = 0, vocab = 0, refused_v1 = 0;
    for (size_t k = 0; k < 3; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", test_shared_path(dirs[k]));
        DIR *d = opendir(dir);
        ck_assert_msg(d != NULL, "cannot list %s", dir);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!has_suffix(e->d_name, ".gguf")) continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            corral_error err;
            gguf_file *f = gguf_open(path, &err);
            if (strcmp(e->d_name, "legacy-v1.gguf") == 0) {
                ck_assert_ptr_null(f);
                refused_v1++;
                continue;
            }
            ck_assert_msg(f != NULL, "%s: %s", path, err.message);
            ck_assert_str_eq(gguf_path(f), path);
            check_file_invariants(f);
            gguf_str arch;
            ck_assert_int_eq(gguf_get_str(f, "general.architecture", &arch, &err), CORRAL_OK);
            ck_assert_uint_gt(arch.len, 0);
            if (k == 2) {
                gguf_type et;
                uint64_t n;
                ck_assert_int_eq(gguf_get_array(f, "tokenizer.ggml.tokens", &et, &n, &err),
                                 CORRAL_OK);
                ck_assert_int_eq(et, GGUF_TYPE_STRING);
                ck_assert_uint_gt(n, 1000);
                vocab++;
            } else {
                ck_assert_uint_gt(gguf_tensor_count(f), 0);
            }
            gguf_destroy(&f);
            opened++;
        }
        closedir(d);
    }
    ck_assert_int_eq(refused_v1, 1);
    ck_assert_int_ge(vocab, 6);
    ck_assert_int_ge(opened, 25);
}
END_TEST

START_TEST(test_stories_metadata) {
    corral_error err;
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_alignment(f), 32);

    gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(s, "llama"));
    ck_assert(!gguf_str_eq(s, "llam"));
    uint32_t u32;
    ck_assert_int_eq(gguf_get_u32(f, "llama.embedding_length", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 64);
    ck_assert_int_eq(gguf_get_u32(f, "llama.block_count", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 5);
    ck_assert_int_eq(gguf_get_u32(f, "llama.attention.head_count", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 8);
    ck_assert_int_eq(gguf_get_u32(f, "llama.attention.head_count_kv", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 4);
    ck_assert_int_eq(gguf_get_u32(f, "llama.feed_forward_length", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 172);
    ck_assert_int_eq(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 1);
    uint64_t u64;
    ck_assert_int_eq(gguf_get_u64(f, "llama.context_length", &u64, &err), CORRAL_OK);
    ck_assert_uint_eq(u64, 2048);
    int32_t i32;
    ck_assert_int_eq(gguf_get_i32(f, "llama.rope.dimension_count", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, 8);
    float eps;
    ck_assert_int_eq(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, &err),
                     CORRAL_OK);
    ck_assert(eps == 1e-5f);
    char eps_text[32];
    gguf_format_value(f, (uint64_t)gguf_find_key(f, "llama.attention.layer_norm_rms_epsilon"),
                      eps_text, sizeof eps_text);
    ck_assert_str_eq(eps_text, "1e-05"); /* the shortest text that reads back exactly */

    /* The "none" ids are stored as uint32 -1: valid data, readable as uint32 and uint64. */
    ck_assert_int_eq(gguf_get_u32(f, "tokenizer.ggml.seperator_token_id", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 4294967295u);
    ck_assert_int_eq(gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 4294967295u);
    ck_assert_int_eq(gguf_get_u64(f, "tokenizer.ggml.padding_token_id", &u64, &err), CORRAL_OK);
    ck_assert_uint_eq(u64, 4294967295u);
    ck_assert_int_eq(gguf_get_i32(f, "tokenizer.ggml.padding_token_id", &i32, &err), CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "does not fit"));
    ck_assert_ptr_nonnull(strstr(err.message, "tokenizer.ggml.padding_token_id"));

    /* The vocabulary: 512 SentencePiece tokens, <unk> <s> </s> first. */
    gguf_type et;
    uint64_t n;
    ck_assert_int_eq(gguf_get_array(f, "tokenizer.ggml.tokens", &et, &n, &err), CORRAL_OK);
    ck_assert_int_eq(et, GGUF_TYPE_STRING);
    ck_assert_uint_eq(n, 512);
    int64_t tokens = gguf_find_key(f, "tokenizer.ggml.tokens");
    ck_assert_int_ge(tokens, 0);
    ck_assert_int_eq(gguf_kv_type(f, (uint64_t)tokens), GGUF_TYPE_ARRAY);
    ck_assert(gguf_str_eq(gguf_array_str(f, (uint64_t)tokens, 0), "<unk>"));
    ck_assert(gguf_str_eq(gguf_array_str(f, (uint64_t)tokens, 1), "<s>"));
    ck_assert(gguf_str_eq(gguf_array_str(f, (uint64_t)tokens, 2), "</s>"));
    for (uint64_t i = 0; i < n; i++) {
        gguf_str t = gguf_array_str(f, (uint64_t)tokens, i);
        ck_assert_ptr_nonnull(t.data);
        ck_assert_uint_gt(t.len, 0);
    }
    ck_assert_ptr_null(gguf_array_str(f, (uint64_t)tokens, 512).data);
    int64_t scores = gguf_find_key(f, "tokenizer.ggml.scores");
    ck_assert_ptr_null(gguf_array_str(f, (uint64_t)scores, 0).data); /* not a string array */
    ck_assert_ptr_null(gguf_array_str(f, gguf_kv_count(f), 0).data);

    char text[256];
    gguf_format_value(f, (uint64_t)tokens, text, sizeof text);
    const char *head = "[string x 512] \"<unk>\", \"<s>\", \"</s>\"";
    ck_assert_msg(strncmp(text, head, strlen(head)) == 0, "%s", text);
    ck_assert_ptr_nonnull(strstr(text, "..."));

    /* token types: unknown (2) then control (3), as llama.cpp's SentencePiece converter writes. */
    int32_t types[512];
    ck_assert_int_eq(gguf_array_copy_i32(f, "tokenizer.ggml.token_type", types, 512, &err),
                     CORRAL_OK);
    ck_assert_int_eq(types[0], 2);
    ck_assert_int_eq(types[1], 3);
    ck_assert_int_eq(types[2], 3);
    float sc[512];
    ck_assert_int_eq(gguf_array_copy_f32(f, "tokenizer.ggml.scores", sc, 512, &err), CORRAL_OK);
    ck_assert_int_eq(gguf_array_copy_f32(f, "tokenizer.ggml.scores", sc, 511, &err), CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "512"));
    ck_assert_ptr_nonnull(strstr(err.message, "511"));
    ck_assert_int_eq(gguf_array_copy_i32(f, "tokenizer.ggml.scores", types, 512, &err),
                     CORRAL_FORMAT);

    /* Wrong types and absent keys are reported, naming the key. */
    ck_assert_int_eq(gguf_get_str(f, "llama.block_count", &s, &err), CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "llama.block_count"));
    ck_assert_ptr_nonnull(strstr(err.message, "uint32"));
    ck_assert_int_eq(gguf_get_u32(f, "general.architecture", &u32, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_f32(f, "llama.block_count", &eps, &err), CORRAL_FORMAT);
    int b;
    ck_assert_int_eq(gguf_get_bool(f, "llama.block_count", &b, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_array(f, "llama.block_count", &et, &n, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_u32(f, "llama.no_such_key", &u32, &err), CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "llama.no_such_key"));
    ck_assert_int_eq(gguf_find_key(f, "llama.no_such_key"), -1);

    /* Tensors. */
    ck_assert_uint_eq(gguf_tensor_count(f), 48);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_int_eq(t->ne[0], 64);
    ck_assert_int_eq(t->ne[1], 512);
    ck_assert_int_eq(t->ne[2], 1);
    ck_assert_int_eq(t->ne[3], 1);
    ck_assert_uint_eq(t->type, TENSOR_TYPE_F32);
    ck_assert_uint_eq(t->size, 64 * 512 * 4);
    ck_assert_ptr_null(gguf_find_tensor(f, "token_embd.weigh"));
    ck_assert_ptr_null(gguf_tensor_at(f, 48));
    gguf_destroy(&f);
    ck_assert_ptr_null(f);
    gguf_destroy(&f); /* NULL-safe */
    gguf_destroy(NULL);
}
END_TEST

/* The F16 stories file is the F32 one rounded to half precision: every tensor the two store as
 * F16 / F32 must agree to half-precision rounding. This checks the data offsets of two files
 * against each other. */
START_TEST(test_stories_f16_matches_f32) {
    corral_error err;
    gguf_file *a = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    ck_assert_msg(a != NULL, "%s", err.message);
    gguf_file *h = gguf_open(test_shared_path("models/stories260K-f16.gguf"), &err);
    ck_assert_msg(h != NULL, "%s", err.message);
    int compared = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(a); i++) {
        const gguf_tensor *ta = gguf_tensor_at(a, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)ta->name.len, ta->name.data);
        const gguf_tensor *th = gguf_find_tensor(h, name);
        ck_assert_msg(th != NULL, "%s missing from the F16 file", name);
        ck_assert_mem_eq(ta->ne, th->ne, sizeof ta->ne);
        int64_t n = ta->ne[0] * ta->ne[1] * ta->ne[2] * ta->ne[3];
        const float *x = ta->data;
        for (int64_t j = 0; j < n; j++) {
            float y;
            if (th->type == TENSOR_TYPE_F16) {
                uint16_t bits;
                memcpy(&bits, (const uint8_t *)th->data + 2 * j, 2);
                y = tensor_fp16_to_f32(bits);
            } else {
                memcpy(&y, (const uint8_t *)th->data + 4 * j, 4);
            }
            ck_assert_msg(fabsf(x[j] - y) <= fabsf(x[j]) * (1.0f / 1024) + 1e-7f,
                          "%s[%" PRId64 "]: %g vs %g", name, j, x[j], y);
        }
        compared++;
    }
    ck_assert_int_eq(compared, 48);
    gguf_destroy(&a);
    gguf_destroy(&h);
}
END_TEST

/* One line of TENSOR_TYPES.txt: "  NAME [D0xD1]: TYPE" or "...: T1 (blk 0); T2 (blk 1)". */
typedef struct tt_entry {
    char name[128];
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    char types[4][16];
    int layers[4]; /* -1: every layer */
    int n_types;
} tt_entry;

static void tt_parse_entry(const char *line, tt_entry *e) {
    memset(e, 0, sizeof *e);
    const char *lb = strstr(line, " [");
    const char *rb = strstr(line, "]: ");
    ck_assert_msg(lb && rb && lb > line + 2, "bad TENSOR_TYPES line: %s", line);
    snprintf(e->name, sizeof e->name, "%.*s", (int)(lb - line - 2), line + 2);
    const char *p = lb + 2;
    for (;;) {
        ck_assert_uint_lt(e->n_dims, GGUF_MAX_DIMS);
        char *end;
        e->ne[e->n_dims++] = strtoll(p, &end, 10);
        ck_assert_msg(end != p, "bad dims in: %s", line);
        if (*end != 'x') {
            ck_assert_msg(end == rb, "bad dims in: %s", line);
            break;
        }
        p = end + 1;
    }
    p = rb + 3;
    while (*p && *p != '\n') {
        ck_assert_int_lt(e->n_types, 4);
        int n = 0;
        while (p[n] && p[n] != ' ' && p[n] != ';' && p[n] != '\n') n++;
        snprintf(e->types[e->n_types], sizeof e->types[0], "%.*s", n, p);
        p += n;
        e->layers[e->n_types] = -1;
        if (strncmp(p, " (blk ", 6) == 0) {
            e->layers[e->n_types] = atoi(p + 6);
            p = strchr(p, ')') + 1;
        }
        e->n_types++;
        if (strncmp(p, "; ", 2) == 0) p += 2;
    }
}

static const char *tt_type_for_layer(const tt_entry *e, int layer) {
    for (int i = 0; i < e->n_types; i++) {
        if (e->layers[i] == -1 || e->layers[i] == layer) return e->types[i];
    }
    return "(none)";
}

static void tt_check_tensor(const char *file, const gguf_file *f, const char *name,
                            const tt_entry *e, int layer) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    ck_assert_msg(t != NULL, "%s: tensor %s missing", file, name);
    ck_assert_msg(t->n_dims == e->n_dims, "%s: %s has %u dims", file, name, t->n_dims);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        int64_t want = d < (int)e->n_dims ? e->ne[d] : 1;
        ck_assert_msg(t->ne[d] == want, "%s: %s ne[%d] = %" PRId64 ", expected %" PRId64, file,
                      name, d, t->ne[d], want);
    }
    ck_assert_msg(strcmp(tensor_type_name(t->type), tt_type_for_layer(e, layer)) == 0,
                  "%s: %s is %s, expected %s", file, name, tensor_type_name(t->type),
                  tt_type_for_layer(e, layer));
}

static void tt_check_file(const char *file, uint64_t n_tensors, const tt_entry *es, int n) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_shared_path("models"));
    snprintf(path + strlen(path), sizeof path - strlen(path), "/%s", file);
    if (access(path, R_OK) != 0) {
        snprintf(path, sizeof path, "%s", test_shared_path("lora"));
        snprintf(path + strlen(path), sizeof path - strlen(path), "/%s", file);
    }
    corral_error err;
    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s: %s", file, err.message);
    ck_assert_msg(gguf_tensor_count(f) == n_tensors, "%s: %" PRIu64 " tensors, expected %" PRIu64,
                  file, gguf_tensor_count(f), n_tensors);
    uint64_t plain = 0, per_layer = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(es[i].name, "blk.*.", 6) == 0) {
            per_layer++;
        } else {
            plain++;
        }
    }
    uint64_t layers = per_layer ? (n_tensors - plain) / per_layer : 0;
    ck_assert_msg(plain + layers * per_layer == n_tensors, "%s: counts do not add up", file);
    /* The layer count implied by the listing must agree with the file's block_count. */
    gguf_str arch;
    if (per_layer && gguf_get_str(f, "general.architecture", &arch, &err) == CORRAL_OK) {
        char key[128];
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.data);
        uint32_t blocks;
        if (gguf_get_u32(f, key, &blocks, &err) == CORRAL_OK) ck_assert_uint_eq(blocks, layers);
    }
    for (int i = 0; i < n; i++) {
        if (strncmp(es[i].name, "blk.*.", 6) != 0) {
            tt_check_tensor(file, f, es[i].name, &es[i], -1);
            continue;
        }
        for (uint64_t l = 0; l < layers; l++) {
            char name[160];
            snprintf(name, sizeof name, "blk.%" PRIu64 ".%s", l, es[i].name + 6);
            tt_check_tensor(file, f, name, &es[i], (int)l);
        }
    }
    gguf_destroy(&f);
}

START_TEST(test_tensor_types_listing) {
    FILE *fp = fopen(test_shared_path("models/TENSOR_TYPES.txt"), "r");
    ck_assert_ptr_nonnull(fp);
    char line[1024], file[1024] = "";
    uint64_t n_tensors = 0;
    static tt_entry entries[128];
    int n = 0, files = 0;
    for (;;) {
        char *got = fgets(line, sizeof line, fp);
        if (!got || strncmp(line, "== ", 3) == 0) {
            if (file[0]) {
                tt_check_file(file, n_tensors, entries, n);
                files++;
            }
            if (!got) break;
            snprintf(file, sizeof file, "%s", line + 3);
            file[strcspn(file, "\n")] = '\0';
            n = 0;
            n_tensors = 0;
        } else if (strncmp(line, "file_type=", 10) == 0) {
            const char *comma = strrchr(line, ',');
            ck_assert_ptr_nonnull(comma);
            ck_assert_int_eq(sscanf(comma + 1, "%" SCNu64 " tensors", &n_tensors), 1);
        } else if (strncmp(line, "  ", 2) == 0) {
            ck_assert_int_lt(n, 128);
            tt_parse_entry(line, &entries[n++]);
        }
    }
    fclose(fp);
    ck_assert_int_ge(files, 20);
}
END_TEST

/* A source file holding the value types the builder has no setter for, and a nested array. */
static void craft_extra_types(tbuf *t) {
    tb_header(t, 3, 0, 8);
    tb_key(t, "x.u8", GGUF_TYPE_UINT8);
    tb_le(t, 200, 1);
    tb_key(t, "x.i8", GGUF_TYPE_INT8);
    tb_le(t, (uint8_t)-5, 1);
    tb_key(t, "x.u16", GGUF_TYPE_UINT16);
    tb_le(t, 65000, 2);
    tb_key(t, "x.i16", GGUF_TYPE_INT16);
    tb_le(t, (uint16_t)-30000, 2);
    tb_key(t, "x.i64", GGUF_TYPE_INT64);
    tb_le(t, (uint64_t) - (INT64_C(1) << 40), 8);
    tb_key(t, "x.f64", GGUF_TYPE_FLOAT64);
    double d = 3.25;
    uint64_t bits;
    memcpy(&bits, &d, 8);
    tb_le(t, bits, 8);
    tb_key(t, "x.u64", GGUF_TYPE_UINT64);
    tb_le(t, 2048, 8);
    tb_key(t, "x.nested", GGUF_TYPE_ARRAY);
    tb_array(t, GGUF_TYPE_ARRAY, 2);
    tb_array(t, GGUF_TYPE_INT32, 2);
    tb_le(t, 7, 4);
    tb_le(t, (uint32_t)-8, 4);
    tb_array(t, GGUF_TYPE_STRING, 1);
    tb_str(t, "deep");
}

typedef struct rt_tensor {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    size_t size;
    uint8_t *data;
} rt_tensor;

START_TEST(test_builder_round_trip) {
    corral_error err;
    gguf_builder *b = gguf_builder_new();
    ck_assert_ptr_nonnull(b);

    /* Scalars through the setters; one key set twice (the last value wins, in place). */
    ck_assert_int_eq(gguf_builder_set_str(b, "general.architecture", "first"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_u32(b, "t.u32", 4294967295u), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_i32(b, "t.i32", INT32_MIN), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_u64(b, "t.u64", UINT64_MAX), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_f32(b, "t.f32", -1.5e-7f), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_bool(b, "t.bool", 7), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, "t.str", "quote \" tab \t é"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, "general.architecture", "llama"), CORRAL_OK);

    /* Numeric arrays of every fixed-size type. */
    uint8_t a_u8[] = {0, 1, 255};
    int8_t a_i8[] = {-128, 0, 127};
    uint16_t a_u16[] = {0, 65535};
    int16_t a_i16[] = {-32768, 32767};
    uint32_t a_u32[] = {1, 2, 2147483647u};
    int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    float a_f32[] = {0.5f, -2.0f, 1e30f};
    uint8_t a_bool[] = {1, 0, 0, 1};
    uint64_t a_u64[] = {0, 12345};
    int64_t a_i64[] = {-7, 2147483647};
    double a_f64[] = {0.25, -1e10};
    struct {
        const char *key;
        gguf_type type;
        const void *data;
        uint64_t n;
    } arrays[] = {
        {"a.u8", GGUF_TYPE_UINT8, a_u8, 3},     {"a.i8", GGUF_TYPE_INT8, a_i8, 3},
        {"a.u16", GGUF_TYPE_UINT16, a_u16, 2},  {"a.i16", GGUF_TYPE_INT16, a_i16, 2},
        {"a.u32", GGUF_TYPE_UINT32, a_u32, 3},  {"a.i32", GGUF_TYPE_INT32, a_i32, 3},
        {"a.f32", GGUF_TYPE_FLOAT32, a_f32, 3}, {"a.bool", GGUF_TYPE_BOOL, a_bool, 4},
        {"a.u64", GGUF_TYPE_UINT64, a_u64, 2},  {"a.i64", GGUF_TYPE_INT64, a_i64, 2},
        {"a.f64", GGUF_TYPE_FLOAT64, a_f64, 2}, {"a.empty", GGUF_TYPE_INT32, NULL, 0},
    };
    size_t n_arrays = sizeof arrays / sizeof arrays[0];
    for (size_t i = 0; i < n_arrays; i++) {
        ck_assert_int_eq(
            gguf_builder_set_array(b, arrays[i].key, arrays[i].type, arrays[i].data, arrays[i].n),
            CORRAL_OK);
    }
    const char *strs[] = {"alpha", "", "gamma\n", "δ"};
    ck_assert_int_eq(gguf_builder_set_str_array(b, "a.str", strs, 4), CORRAL_OK);

    /* The remaining value types and a nested array, copied from a crafted file. */
    tbuf src_bytes = {0};
    craft_extra_types(&src_bytes);
    gguf_file *src = gguf_open_buffer(src_bytes.d, src_bytes.len, "extra.gguf", &err);
    ck_assert_msg(src != NULL, "%s", err.message);
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        ck_assert_int_eq(gguf_builder_copy_kv(b, src, i), CORRAL_OK);
    }
    ck_assert_int_eq(gguf_builder_copy_kv(b, src, gguf_kv_count(src)), CORRAL_INVALID_ARGUMENT);

    /* Tensors of several types, odd sizes included (I8 x 3 needs padding). */
    rt_tensor ts[] = {
        {"w.f32", TENSOR_TYPE_F32, 2, {5, 3, 1, 1}, 5 * 3 * 4, NULL},
        {"w.f16", TENSOR_TYPE_F16, 2, {64, 2, 1, 1}, 64 * 2 * 2, NULL},
        {"w.i8", TENSOR_TYPE_I8, 1, {3, 1, 1, 1}, 3, NULL},
        {"w.q4_0", TENSOR_TYPE_Q4_0, 2, {64, 2, 1, 1}, 2 * 2 * 18, NULL},
        {"w.q8_0", TENSOR_TYPE_Q8_0, 3, {32, 2, 2, 1}, 4 * 34, NULL},
        {"w.q4_k", TENSOR_TYPE_Q4_K, 4, {256, 1, 2, 1}, 2 * 144, NULL},
        {"w.q6_k", TENSOR_TYPE_Q6_K, 2, {256, 3, 1, 1}, 3 * 210, NULL},
        {"w.iq2_xxs", TENSOR_TYPE_IQ2_XXS, 1, {256, 1, 1, 1}, 66, NULL}, /* known, not computed */
        {"w.empty", TENSOR_TYPE_F32, 2, {0, 4, 1, 1}, 0, NULL},
    };
    size_t n_ts = sizeof ts / sizeof ts[0];
    for (size_t i = 0; i < n_ts; i++) {
        ts[i].data = malloc(ts[i].size + 1);
        for (size_t j = 0; j < ts[i].size; j++) ts[i].data[j] = (uint8_t)rng_next();
        ck_assert_int_eq(gguf_builder_add_tensor(b, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne,
                                                 ts[i].data, &err),
                         CORRAL_OK);
    }

    const char *path = tmp_path("round-trip.gguf");
    ck_assert_int_eq(gguf_builder_write(b, path, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    ck_assert_ptr_null(b);
    gguf_builder_destroy(&b);
    ck_assert_int_eq(tmp_count_prefix("round-trip.gguf"), 1); /* no temporary file left */

    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    check_file_invariants(f);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_kv_count(f), 7 + n_arrays + 1 + gguf_kv_count(src));
    ck_assert(gguf_str_eq(gguf_kv_key(f, 0), "general.architecture")); /* replaced in place */

    gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(s, "llama"));
    ck_assert_int_eq(gguf_get_str(f, "t.str", &s, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(s, "quote \" tab \t é"));
    uint32_t u32;
    ck_assert_int_eq(gguf_get_u32(f, "t.u32", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 4294967295u);
    int32_t i32;
    ck_assert_int_eq(gguf_get_i32(f, "t.i32", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, INT32_MIN);
    uint64_t u64;
    ck_assert_int_eq(gguf_get_u64(f, "t.u64", &u64, &err), CORRAL_OK);
    ck_assert_uint_eq(u64, UINT64_MAX);
    ck_assert_int_eq(gguf_get_u32(f, "t.u64", &u32, &err), CORRAL_FORMAT);
    float fl;
    ck_assert_int_eq(gguf_get_f32(f, "t.f32", &fl, &err), CORRAL_OK);
    ck_assert(fl == -1.5e-7f);
    int bv = 0;
    ck_assert_int_eq(gguf_get_bool(f, "t.bool", &bv, &err), CORRAL_OK);
    ck_assert_int_eq(bv, 1);

    for (size_t i = 0; i < n_arrays; i++) {
        gguf_type et;
        uint64_t n;
        ck_assert_int_eq(gguf_get_array(f, arrays[i].key, &et, &n, &err), CORRAL_OK);
        ck_assert_int_eq(et, arrays[i].type);
        ck_assert_uint_eq(n, arrays[i].n);
    }
    int32_t ib[8];
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.u8", ib, 3, &err), CORRAL_OK);
    ck_assert(ib[0] == 0 && ib[1] == 1 && ib[2] == 255);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.i8", ib, 3, &err), CORRAL_OK);
    ck_assert(ib[0] == -128 && ib[1] == 0 && ib[2] == 127);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.u16", ib, 2, &err), CORRAL_OK);
    ck_assert(ib[0] == 0 && ib[1] == 65535);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.i16", ib, 2, &err), CORRAL_OK);
    ck_assert(ib[0] == -32768 && ib[1] == 32767);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.u32", ib, 3, &err), CORRAL_OK);
    ck_assert(ib[0] == 1 && ib[1] == 2 && ib[2] == INT32_MAX);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.i32", ib, 3, &err), CORRAL_OK);
    ck_assert(ib[0] == INT32_MIN && ib[1] == -1 && ib[2] == INT32_MAX);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.bool", ib, 4, &err), CORRAL_OK);
    ck_assert(ib[0] == 1 && ib[1] == 0 && ib[2] == 0 && ib[3] == 1);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.u64", ib, 2, &err), CORRAL_OK);
    ck_assert(ib[0] == 0 && ib[1] == 12345);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.i64", ib, 2, &err), CORRAL_OK);
    ck_assert(ib[0] == -7 && ib[1] == 2147483647);
    ck_assert_int_eq(gguf_array_copy_i32(f, "a.empty", ib, 0, &err), CORRAL_OK);
    float fb[4];
    ck_assert_int_eq(gguf_array_copy_f32(f, "a.f32", fb, 3, &err), CORRAL_OK);
    ck_assert(fb[0] == 0.5f && fb[1] == -2.0f && fb[2] == 1e30f);
    ck_assert_int_eq(gguf_array_copy_f32(f, "a.f64", fb, 2, &err), CORRAL_OK);
    ck_assert(fb[0] == 0.25f && fb[1] == -1e10f);
    int64_t ks = gguf_find_key(f, "a.str");
    ck_assert_int_ge(ks, 0);
    for (int i = 0; i < 4; i++) ck_assert(gguf_str_eq(gguf_array_str(f, (uint64_t)ks, i), strs[i]));

    /* Copied values: same type, same rendering, same numbers. */
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        char key[64], t1[256], t2[256];
        gguf_str k = gguf_kv_key(src, i);
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.data);
        int64_t j = gguf_find_key(f, key);
        ck_assert_msg(j >= 0, "%s not copied", key);
        ck_assert_int_eq(gguf_kv_type(f, (uint64_t)j), gguf_kv_type(src, i));
        gguf_format_value(src, i, t1, sizeof t1);
        gguf_format_value(f, (uint64_t)j, t2, sizeof t2);
        ck_assert_str_eq(t1, t2);
    }
    ck_assert_int_eq(gguf_get_u32(f, "x.u8", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 200);
    ck_assert_int_eq(gguf_get_i32(f, "x.i8", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, -5);
    ck_assert_int_eq(gguf_get_u32(f, "x.i8", &u32, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_u32(f, "x.u16", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 65000);
    ck_assert_int_eq(gguf_get_i32(f, "x.i16", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, -30000);
    ck_assert_int_eq(gguf_get_i32(f, "x.i64", &i32, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_u64(f, "x.i64", &u64, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_f32(f, "x.f64", &fl, &err), CORRAL_OK);
    ck_assert(fl == 3.25f);
    ck_assert_int_eq(gguf_get_u32(f, "x.u64", &u32, &err), CORRAL_OK); /* u64 read as u32 */
    ck_assert_uint_eq(u32, 2048);
    char text[256];
    int64_t nested = gguf_find_key(f, "x.nested");
    gguf_format_value(f, (uint64_t)nested, text, sizeof text);
    ck_assert_str_eq(text, "[array x 2] [int32 x 2] 7, -8, [string x 1] \"deep\"");
    ck_assert_ptr_null(gguf_array_str(f, (uint64_t)nested, 0).data);

    /* Tensors: every field and every byte, data aligned in memory. */
    ck_assert_uint_eq(gguf_tensor_count(f), n_ts);
    for (size_t i = 0; i < n_ts; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert(gguf_str_eq(t->name, ts[i].name));
        ck_assert_uint_eq(t->type, ts[i].type);
        ck_assert_uint_eq(t->n_dims, ts[i].n_dims);
        ck_assert_mem_eq(t->ne, ts[i].ne, sizeof t->ne);
        ck_assert_uint_eq(t->size, ts[i].size);
        if (ts[i].size) ck_assert_mem_eq(t->data, ts[i].data, ts[i].size);
        ck_assert_uint_eq((uintptr_t)t->data % 32, 0);
        free(ts[i].data);
    }
    gguf_destroy(&f);
    gguf_destroy(&src);
    tb_free(&src_bytes);
}
END_TEST

/* Every key and tensor of a real model copied through the builder comes back identical. */
START_TEST(test_builder_copies_real_model) {
    corral_error err;
    gguf_file *a = gguf_open(test_shared_path("models/stories260K-q4_0.gguf"), &err);
    ck_assert_msg(a != NULL, "%s", err.message);
    gguf_builder *b = gguf_builder_new();
    for (uint64_t i = 0; i < gguf_kv_count(a); i++) {
        ck_assert_int_eq(gguf_builder_copy_kv(b, a, i), CORRAL_OK);
    }
    for (uint64_t i = 0; i < gguf_tensor_count(a); i++) {
        const gguf_tensor *t = gguf_tensor_at(a, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        ck_assert_int_eq(gguf_builder_add_tensor(b, name, t->type, t->n_dims, t->ne, t->data, &err),
                         CORRAL_OK);
    }
    const char *path = tmp_path("copy.gguf");
    ck_assert_int_eq(gguf_builder_write(b, path, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    gguf_file *c = gguf_open(path, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_kv_count(c), gguf_kv_count(a));
    for (uint64_t i = 0; i < gguf_kv_count(a); i++) {
        gguf_str k1 = gguf_kv_key(a, i), k2 = gguf_kv_key(c, i);
        ck_assert_uint_eq(k1.len, k2.len);
        ck_assert_mem_eq(k1.data, k2.data, k1.len);
        ck_assert_int_eq(gguf_kv_type(a, i), gguf_kv_type(c, i));
        char t1[512], t2[512];
        gguf_format_value(a, i, t1, sizeof t1);
        gguf_format_value(c, i, t2, sizeof t2);
        ck_assert_str_eq(t1, t2);
    }
    int64_t tok = gguf_find_key(c, "tokenizer.ggml.tokens");
    for (uint64_t i = 0; i < 512; i++) {
        gguf_str x = gguf_array_str(a, (uint64_t)tok, i), y = gguf_array_str(c, (uint64_t)tok, i);
        ck_assert_uint_eq(x.len, y.len);
        ck_assert_mem_eq(x.data, y.data, x.len);
    }
    ck_assert_uint_eq(gguf_tensor_count(c), gguf_tensor_count(a));
    for (uint64_t i = 0; i < gguf_tensor_count(a); i++) {
        const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(c, i);
        ck_assert_uint_eq(x->type, y->type);
        ck_assert_mem_eq(x->ne, y->ne, sizeof x->ne);
        ck_assert_uint_eq(x->size, y->size);
        ck_assert_mem_eq(x->data, y->data, x->size);
    }
    gguf_destroy(&c);
    gguf_destroy(&a);
}
END_TEST

START_TEST(test_crafted_valid_file_opens) {
    tbuf t = {0};
    craft_marks m;
    craft_valid(&t, &m);
    void *copy;
    corral_error err;
    gguf_file *f = open_exact(&t, t.len, &copy, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_data_offset(f), m.data);
    ck_assert_uint_eq(gguf_tensor_count(f), 2);
    ck_assert_ptr_eq(gguf_find_tensor(f, "out")->data, (uint8_t *)copy + m.data + 32);
    ck_assert_str_eq(gguf_path(f), "crafted.gguf");
    char text[64];
    gguf_format_value(f, 1, text, sizeof text);
    ck_assert_str_eq(text, "[bool x 3] true, false, true");
    gguf_destroy(&f);
    free(copy);
    tb_free(&t);
}
END_TEST

/* ---- limits -------------------------------------------------------------------------------- */

/* A GGUF file at path holding one F32 tensor "big" of n elements. */
static void write_one_f32_tensor(const char *path, const float *data, int64_t n) {
    corral_error err;
    gguf_builder *b = gguf_builder_new();
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(gguf_builder_set_str(b, "general.architecture", "llama"), CORRAL_OK);
    const int64_t ne[1] = {n};
    ck_assert_int_eq(gguf_builder_add_tensor(b, "big", TENSOR_TYPE_F32, 1, ne, data, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, path, &err), CORRAL_OK);
    gguf_builder_destroy(&b);
}

/* A file of 2 MiB or more is mapped at a 2 MiB boundary (so that the kernel can map it in 2 MiB
 * pages), and reads back the same as any other. */
START_TEST(test_large_file_mapped_aligned) {
    corral_error err;
    const int64_t n = 800 * 1024; /* 3.2 MB of F32 */
    float *data = malloc((size_t)n * sizeof *data);
    ck_assert_ptr_nonnull(data);
    for (int64_t i = 0; i < n; i++) data[i] = (float)i * 0.5f;
    const char *path = tmp_path("large.gguf");
    write_one_f32_tensor(path, data, n);
    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_ge(gguf_file_size(f), (uint64_t)n * 4);
    ck_assert_uint_eq((uintptr_t)gguf_file_data(f) % (2u << 20), 0);
    const gguf_tensor *t = gguf_find_tensor(f, "big");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, data, (size_t)n * sizeof *data), 0);
    /* The last byte of the file is readable (the mapping was not cut short by the alignment). */
    const uint8_t *base = gguf_file_data(f);
    size_t size;
    uint8_t *whole = read_whole(path, &size);
    ck_assert_uint_eq(size, gguf_file_size(f));
    ck_assert_uint_eq(base[size - 1], whole[size - 1]);
    free(whole);
    gguf_destroy(&f);
    free(data);
}
END_TEST

/* The VmFlags line of /proc/self/smaps for the mapping that holds p ("" when not found). */
static void vm_flags_at(const void *p, char *flags, size_t cap) {
    flags[0] = 0;
    FILE *fp = fopen("/proc/self/smaps", "r");
    ck_assert_ptr_nonnull(fp);
    char line[512];
    bool inside = false;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            strncpy(flags, line + 8, cap - 1);
            flags[cap - 1] = 0;
            break;
        }
    }
    fclose(fp);
}

/* Page-size advice lands on the pages asked for (VmFlags hg / nh) and nowhere else; ranges
 * outside the mapping, empty ones and a buffer-parsed file are ignored. */
START_TEST(test_advise_pages) {
    corral_error err;
    const int64_t n = 1024 * 1024; /* 4 MiB of F32: two 2 MiB stretches */
    float *data = calloc((size_t)n, sizeof *data);
    ck_assert_ptr_nonnull(data);
    const char *path = tmp_path("advise.gguf");
    write_one_f32_tensor(path, data, n);
    gguf_file *f = gguf_open(path, &err);
    ck_assert_ptr_nonnull(f);
    const uint8_t *base = gguf_file_data(f);
    const size_t size = (size_t)gguf_file_size(f);
    /* Ignored: nothing to do, and no crash. */
    gguf_advise_pages(f, NULL, 100, GGUF_PAGES_SPARSE);
    gguf_advise_pages(f, base, 0, GGUF_PAGES_SPARSE);
    gguf_advise_pages(f, base + size + 4096, 4096, GGUF_PAGES_SPARSE);
    gguf_advise_pages(NULL, base, size, GGUF_PAGES_SPARSE);
    char flags[512];
    vm_flags_at(base, flags, sizeof flags);
    ck_assert_msg(flags[0] != 0, "the mapping is not in /proc/self/smaps");
    ck_assert_ptr_null(strstr(flags, " nh"));
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
        /* The second half sparse (from inside a page: the advice covers the pages it touches). */
        gguf_advise_pages(f, base + size / 2 + 100, size, GGUF_PAGES_SPARSE);
        gguf_advise_pages(f, base, size / 2, GGUF_PAGES_STREAMED);
        vm_flags_at(base, flags, sizeof flags);
        ck_assert_msg(strstr(flags, " hg") && !strstr(flags, " nh"), "first half: %s", flags);
        vm_flags_at(base + size - 1, flags, sizeof flags);
        ck_assert_msg(strstr(flags, " nh") && !strstr(flags, " hg"), "second half: %s", flags);
    }
    gguf_destroy(&f);
    /* A buffer-parsed file: advice is a no-op. */
    size_t bsize;
    uint8_t *whole = read_whole(path, &bsize);
    gguf_file *fb = gguf_open_buffer(whole, bsize, "buffer", &err);
    ck_assert_ptr_nonnull(fb);
    gguf_advise_pages(fb, whole, bsize, GGUF_PAGES_SPARSE);
    gguf_destroy(&fb);
    free(whole);
    free(data);
}
END_TEST

/* gguf_open_streamed advises the whole mapping streamed (VmFlags hg) as it maps it, and reads the
 * same as gguf_open, whose mapping carries no advice. */
START_TEST(test_open_streamed_advised_from_the_start) {
    corral_error err;
    const int64_t n = 1024 * 1024; /* 4 MiB of F32 */
    float *data = malloc((size_t)n * sizeof *data);
    ck_assert_ptr_nonnull(data);
    for (int64_t i = 0; i < n; i++) data[i] = (float)(i % 1000);
    const char *path = tmp_path("streamed.gguf");
    write_one_f32_tensor(path, data, n);
    gguf_file *plain = gguf_open(path, &err);
    ck_assert_msg(plain != NULL, "%s", err.message);
    gguf_file *f = gguf_open_streamed(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    const gguf_tensor *t = gguf_find_tensor(f, "big");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, data, (size_t)n * sizeof *data), 0);
    ck_assert_uint_eq((uintptr_t)gguf_file_data(f) % (2u << 20), 0);
    char flags[512];
    vm_flags_at(gguf_file_data(plain), flags, sizeof flags);
    ck_assert_msg(flags[0] != 0 && !strstr(flags, " hg"), "gguf_open: %s", flags);
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
        const uint8_t *base = gguf_file_data(f);
        vm_flags_at(base, flags, sizeof flags);
        ck_assert_msg(strstr(flags, " hg"), "start: %s", flags);
        vm_flags_at(base + gguf_file_size(f) - 1, flags, sizeof flags);
        ck_assert_msg(strstr(flags, " hg"), "end: %s", flags);
    }
    gguf_destroy(&plain);
    gguf_destroy(&f);
    ck_assert_ptr_null(gguf_open_streamed(tmp_path("no-such.gguf"), &err));
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
    free(data);
}
END_TEST

START_TEST(test_empty_file_opens) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 0);
    void *copy;
    corral_error err;
    gguf_file *f = open_exact(&t, t.len, &copy, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_kv_count(f), 0);
    ck_assert_uint_eq(gguf_tensor_count(f), 0);
    ck_assert_uint_eq(gguf_alignment(f), GGUF_DEFAULT_ALIGNMENT);
    ck_assert_uint_eq(gguf_data_offset(f), 24); /* no padding needed without tensors */
    ck_assert_int_eq(gguf_find_key(f, "general.architecture"), -1);
    ck_assert_ptr_null(gguf_find_tensor(f, "x"));
    ck_assert_ptr_null(gguf_kv_key(f, 0).data);
    gguf_destroy(&f);
    free(copy);
    tb_free(&t);

    /* Version 2 is read like 3. */
    tb_header(&t, 2, 0, 0);
    expect_accept(&t);
    tb_free(&t);

    /* The builder writes the same. */
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("empty.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    f = gguf_open(tmp_path("empty.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_file_size(f), 24);
    gguf_destroy(&f);
}
END_TEST

START_TEST(test_empty_strings) {
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_set_str(b, "", "empty key"), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str(b, "s.empty", ""), CORRAL_OK);
    const char *strs[] = {"", "", ""};
    ck_assert_int_eq(gguf_builder_set_str_array(b, "s.empties", strs, 3), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_set_str_array(b, "s.none", strs, 0), CORRAL_OK);
    corral_error err;
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("strings.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    gguf_file *f = gguf_open(tmp_path("strings.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "", &s, &err), CORRAL_OK);
    ck_assert(gguf_str_eq(s, "empty key"));
    ck_assert_int_eq(gguf_get_str(f, "s.empty", &s, &err), CORRAL_OK);
    ck_assert_uint_eq(s.len, 0);
    ck_assert(gguf_str_eq(s, ""));
    int64_t k = gguf_find_key(f, "s.empties");
    for (int i = 0; i < 3; i++) {
        gguf_str e = gguf_array_str(f, (uint64_t)k, i);
        ck_assert_ptr_nonnull(e.data);
        ck_assert_uint_eq(e.len, 0);
    }
    gguf_type et;
    uint64_t n;
    ck_assert_int_eq(gguf_get_array(f, "s.none", &et, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(gguf_array_str(f, (uint64_t)gguf_find_key(f, "s.none"), 0).data);
    char text[64];
    gguf_format_value(f, (uint64_t)gguf_find_key(f, "s.empty"), text, sizeof text);
    ck_assert_str_eq(text, "\"\"");
    gguf_destroy(&f);
}
END_TEST

START_TEST(test_huge_string_array) {
    enum { N = 200000 };
    char **strs = malloc(N * sizeof *strs);
    for (int i = 0; i < N; i++) {
        strs[i] = malloc(16);
        snprintf(strs[i], 16, "tok%d", i * 7);
    }
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(
        gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", (const char *const *)strs, N),
        CORRAL_OK);
    corral_error err;
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("big.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    gguf_file *f = gguf_open(tmp_path("big.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    int64_t k = gguf_find_key(f, "tokenizer.ggml.tokens");
    /* Backwards, so that an implementation that walks from the start would be quadratic. */
    for (int i = N - 1; i >= 0; i--) {
        gguf_str s = gguf_array_str(f, (uint64_t)k, (uint64_t)i);
        ck_assert_msg(gguf_str_eq(s, strs[i]), "element %d", i);
    }
    ck_assert_ptr_null(gguf_array_str(f, (uint64_t)k, N).data);
    gguf_destroy(&f);
    for (int i = 0; i < N; i++) free(strs[i]);
    free(strs);
}
END_TEST

START_TEST(test_alignment_extremes) {
    corral_error err;
    /* Alignment 1: data right after the header, tensors back to back at odd offsets. */
    tbuf t = {0};
    tinfo one[] = {{"a", 1, {3}, TENSOR_TYPE_I8, 0}, {"b", 1, {5}, TENSOR_TYPE_I8, 3}};
    craft_tensors(&t, one, 2, 1, 8);
    void *copy;
    gguf_file *f = open_exact(&t, t.len, &copy, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_alignment(f), 1);
    ck_assert_uint_eq(gguf_data_offset(f), t.len - 8);
    ck_assert_ptr_eq(gguf_find_tensor(f, "b")->data, (uint8_t *)copy + t.len - 5);
    gguf_destroy(&f);
    free(copy);
    tb_free(&t);

    /* The largest uint32 power of two, without tensors: fine (no padding is needed). */
    craft_tensors(&t, NULL, 0, 0x80000000u, 0);
    f = open_exact(&t, t.len, &copy, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_alignment(f), 0x80000000u);
    gguf_destroy(&f);
    free(copy);
    tb_free(&t);

    /* With a tensor the 2 GiB padding is not there: refused cleanly, no huge read. */
    tb_header(&t, 3, 1, 1);
    tb_key(&t, "general.alignment", GGUF_TYPE_UINT32);
    tb_le(&t, 0x80000000u, 4);
    tb_tensor(&t, "a", 1, (uint64_t[]){4}, TENSOR_TYPE_F32, 0);
    tb_fill(&t, 64);
    expect_reject(&t, CORRAL_FORMAT, "truncated");
    tb_free(&t);

    /* A page-sized alignment through the builder: data aligned to 4096 in memory. */
    gguf_builder *b = gguf_builder_new();
    ck_assert_int_eq(gguf_builder_set_u32(b, "general.alignment", 4096), CORRAL_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_int_eq(gguf_builder_add_tensor(b, "x", TENSOR_TYPE_F32, 1, (int64_t[]){8}, x, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "y", TENSOR_TYPE_F32, 1, (int64_t[]){8}, x, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("a4096.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    f = gguf_open(tmp_path("a4096.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(gguf_alignment(f), 4096);
    ck_assert_uint_eq(gguf_find_tensor(f, "y")->offset, 4096);
    ck_assert_uint_eq((uintptr_t)gguf_find_tensor(f, "y")->data % 4096, 0);
    ck_assert_mem_eq(gguf_find_tensor(f, "y")->data, x, sizeof x);
    gguf_destroy(&f);
}
END_TEST

static void craft_nested(tbuf *t, int depth) {
    tb_header(t, 3, 0, 1);
    tb_key(t, "deep", GGUF_TYPE_ARRAY);
    for (int d = 1; d < depth; d++) tb_array(t, GGUF_TYPE_ARRAY, 1);
    tb_array(t, GGUF_TYPE_UINT8, 1);
    tb_le(t, 42, 1);
}

START_TEST(test_nesting_limit) {
    tbuf t = {0};
    craft_nested(&t, 8);
    expect_accept(&t);
    tb_free(&t);
    craft_nested(&t, 9);
    expect_reject(&t, CORRAL_FORMAT, "nested");
    tb_free(&t);
}
END_TEST

START_TEST(test_integer_conversion_edges) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 6);
    tb_key(&t, "u64.big", GGUF_TYPE_UINT64);
    tb_le(&t, UINT64_C(1) << 32, 8);
    tb_key(&t, "i64.min", GGUF_TYPE_INT64);
    tb_le(&t, (uint64_t)INT64_MIN, 8);
    tb_key(&t, "i32.min", GGUF_TYPE_INT32);
    tb_le(&t, (uint32_t)INT32_MIN, 4);
    tb_key(&t, "i64.i32min", GGUF_TYPE_INT64);
    tb_le(&t, (uint64_t)(int64_t)INT32_MIN, 8);
    tb_key(&t, "flag", GGUF_TYPE_BOOL);
    tb_le(&t, 1, 1);
    tb_key(&t, "f64.huge", GGUF_TYPE_FLOAT64);
    double huge = 1e300;
    uint64_t bits;
    memcpy(&bits, &huge, 8);
    tb_le(&t, bits, 8);
    void *copy;
    corral_error err;
    gguf_file *f = open_exact(&t, t.len, &copy, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float fl;
    ck_assert_int_eq(gguf_get_u32(f, "u64.big", &u32, &err), CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "4294967296"));
    ck_assert_int_eq(gguf_get_u64(f, "u64.big", &u64, &err), CORRAL_OK);
    ck_assert_uint_eq(u64, UINT64_C(1) << 32);
    ck_assert_int_eq(gguf_get_i32(f, "i64.min", &i32, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_u64(f, "i64.min", &u64, &err), CORRAL_FORMAT);
    ck_assert_int_eq(gguf_get_i32(f, "i32.min", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, INT32_MIN);
    ck_assert_int_eq(gguf_get_i32(f, "i64.i32min", &i32, &err), CORRAL_OK);
    ck_assert_int_eq(i32, INT32_MIN);
    ck_assert_int_eq(gguf_get_u32(f, "flag", &u32, &err), CORRAL_OK);
    ck_assert_uint_eq(u32, 1);
    int b;
    ck_assert_int_eq(gguf_get_bool(f, "flag", &b, &err), CORRAL_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(gguf_get_f32(f, "f64.huge", &fl, &err), CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "f64.huge"));
    char text[64];
    gguf_format_value(f, 1, text, sizeof text);
    ck_assert_str_eq(text, "-9223372036854775808");
    gguf_destroy(&f);
    free(copy);
    tb_free(&t);
}
END_TEST

START_TEST(test_format_value_small_buffers) {
    corral_error err;
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    int64_t tokens = gguf_find_key(f, "tokenizer.ggml.tokens");
    char buf[8];
    memset(buf, 'Z', sizeof buf);
    ck_assert_uint_eq(gguf_format_value(f, (uint64_t)tokens, buf, sizeof buf), 7);
    ck_assert_str_eq(buf, "[string");
    ck_assert_uint_eq(gguf_format_value(f, (uint64_t)tokens, buf, 1), 0);
    ck_assert_str_eq(buf, "");
    ck_assert_uint_eq(gguf_format_value(f, (uint64_t)tokens, buf, 0), 0);
    ck_assert_uint_eq(gguf_format_value(f, gguf_kv_count(f), buf, sizeof buf), 0);
    ck_assert_str_eq(gguf_type_name(GGUF_TYPE_FLOAT64), "float64");
    ck_assert_str_eq(gguf_type_name(GGUF_TYPE_COUNT), "?");
    gguf_destroy(&f);

    /* Long strings are cut, and never inside a UTF-8 character. */
    gguf_builder *b = gguf_builder_new();
    char longs[301];
    for (int i = 0; i < 300; i += 2) memcpy(longs + i, "\xc3\xa9", 2); /* "é" x 150 */
    longs[300] = '\0';
    gguf_builder_set_str(b, "long", longs);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("long.gguf"), &err), CORRAL_OK);
    gguf_builder_destroy(&b);
    f = gguf_open(tmp_path("long.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    char text[512];
    size_t n = gguf_format_value(f, 0, text, sizeof text);
    ck_assert_uint_lt(n, 100);
    ck_assert_ptr_nonnull(strstr(text, "\"..."));
    ck_assert_int_eq((int)(strstr(text, "\"...") - text - 1) % 2, 0);
    gguf_destroy(&f);
}
END_TEST

/* ---- errors -------------------------------------------------------------------------------- */

START_TEST(test_truncated_everywhere) {
    tbuf t = {0};
    craft_marks m;
    craft_valid(&t, &m);
    expect_reject_len(&t, 0, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, 3, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, m.in_header, CORRAL_FORMAT, "n_tensors");
    expect_reject_len(&t, m.in_header, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, m.in_key, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, m.in_key, CORRAL_FORMAT, "key #3");
    expect_reject_len(&t, m.in_array, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, m.in_array, CORRAL_FORMAT, "test.names");
    expect_reject_len(&t, m.in_infos, CORRAL_FORMAT, "truncated");
    expect_reject_len(&t, m.in_infos, CORRAL_FORMAT, "tensor 'tok'");
    expect_reject_len(&t, m.data - 1, CORRAL_FORMAT, "truncated"); /* inside the padding */
    expect_reject_len(&t, m.in_data, CORRAL_FORMAT, "data runs past end of file");
    expect_reject_len(&t, m.in_data, CORRAL_FORMAT, "tensor 'out'");
    expect_reject_len(&t, t.len - 1, CORRAL_FORMAT, "data runs past end of file");
    tb_free(&t);
}
END_TEST

START_TEST(test_wrong_magic) {
    tbuf t = {0};
    craft_marks m;
    craft_valid(&t, &m);
    memcpy(t.d, "GGML", 4);
    expect_reject(&t, CORRAL_FORMAT, "magic");
    expect_reject(&t, CORRAL_FORMAT, "GGML");
    tb_free(&t);
}
END_TEST

START_TEST(test_legacy_v1_refused) {
    corral_error err;
    const char *path = test_shared_path("models/legacy-v1.gguf");
    gguf_file *f = gguf_open(path, &err);
    ck_assert_ptr_null(f);
    ck_assert_int_eq(err.status, CORRAL_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "version 1"));
    ck_assert_ptr_nonnull(strstr(err.message, "legacy-v1.gguf"));
}
END_TEST

START_TEST(test_other_versions_refused) {
    tbuf t = {0};
    craft_marks m;
    craft_valid(&t, &m);
    const uint8_t be3[4] = {0, 0, 0, 3}; /* version 3 written big-endian */
    memcpy(t.d + 4, be3, 4);
    expect_reject(&t, CORRAL_UNSUPPORTED, "big-endian");
    const uint8_t v4[4] = {4, 0, 0, 0};
    memcpy(t.d + 4, v4, 4);
    expect_reject(&t, CORRAL_UNSUPPORTED, "version 4");
    tb_free(&t);
}
END_TEST

START_TEST(test_file_system_errors) {
    corral_error err;
    ck_assert_ptr_null(gguf_open(tmp_path("no-such.gguf"), &err));
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "no-such.gguf"));
    ck_assert_ptr_null(gguf_open(tmp_dir, &err));
    ck_assert_int_eq(err.status, CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "not a regular file"));
    FILE *fp = fopen(tmp_path("zero.gguf"), "wb");
    fclose(fp);
    ck_assert_ptr_null(gguf_open(tmp_path("zero.gguf"), &err));
    ck_assert_int_eq(err.status, CORRAL_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.message, "empty"));
    ck_assert_ptr_null(gguf_open(NULL, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_null(gguf_open_buffer(NULL, 10, "x", &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_data_past_end) {
    tbuf t = {0};
    tinfo ts[] = {{"a", 1, {8}, TENSOR_TYPE_F32, 0},
                  {"big.weight", 2, {8, 4}, TENSOR_TYPE_F32, 32}};
    craft_tensors(&t, ts, 2, 0, 32 + 8 * 4 * 4 - 1);
    expect_reject(&t, CORRAL_FORMAT, "data runs past end of file");
    expect_reject(&t, CORRAL_FORMAT, "tensor 'big.weight'");
    tb_free(&t);
    /* An offset beyond the file, far enough to overflow a naive offset + size. */
    tinfo far[] = {{"far", 1, {8}, TENSOR_TYPE_F32, UINT64_MAX - 31}};
    craft_tensors(&t, far, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "data runs past end of file");
    tb_free(&t);
}
END_TEST

START_TEST(test_absurd_dimensions) {
    tbuf t = {0};
    /* 2^40 x 2^40 elements: the element count overflows int64. */
    tinfo a[] = {{"huge", 2, {UINT64_C(1) << 40, UINT64_C(1) << 40}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, a, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "overflow");
    expect_reject(&t, CORRAL_FORMAT, "tensor 'huge'");
    tb_free(&t);
    /* 2^62 F32 elements fit int64, but their 2^64 bytes do not fit uint64. */
    tinfo b[] = {{"wide", 1, {UINT64_C(1) << 62}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, b, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "overflow");
    tb_free(&t);
    /* 2^61 F32: 2^63 bytes, representable, but far past the end of the file. */
    tinfo c[] = {{"long", 1, {UINT64_C(1) << 61}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, c, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "data runs past end of file");
    tb_free(&t);
    /* Negative extents are refused, as llama.cpp does. */
    tinfo d[] = {{"neg", 2, {8, (uint64_t)-1}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, d, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "negative");
    tb_free(&t);
    /* A row that is not whole blocks. */
    tinfo e[] = {{"q", 1, {33}, TENSOR_TYPE_Q4_0, 0}};
    craft_tensors(&t, e, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "block size");
    tb_free(&t);
}
END_TEST

START_TEST(test_absurd_counts) {
    tbuf t = {0};
    tb_header(&t, 3, UINT64_C(1) << 60, 0);
    tb_fill(&t, 100);
    expect_reject(&t, CORRAL_FORMAT, "n_tensors");
    tb_free(&t);
    tb_header(&t, 3, 0, UINT64_C(1) << 60);
    tb_fill(&t, 100);
    expect_reject(&t, CORRAL_FORMAT, "n_kv");
    tb_free(&t);
    const gguf_type elems[] = {GGUF_TYPE_UINT8, GGUF_TYPE_UINT64, GGUF_TYPE_STRING,
                               GGUF_TYPE_ARRAY};
    for (size_t i = 0; i < 4; i++) {
        tb_header(&t, 3, 0, 1);
        tb_key(&t, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
        tb_array(&t, elems[i], UINT64_C(1) << 60);
        tb_fill(&t, 100);
        expect_reject(&t, CORRAL_FORMAT, "array count");
        expect_reject(&t, CORRAL_FORMAT, "tokenizer.ggml.tokens");
        tb_free(&t);
    }
    /* The count of an array inside an array. */
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "outer", GGUF_TYPE_ARRAY);
    tb_array(&t, GGUF_TYPE_ARRAY, 1);
    tb_array(&t, GGUF_TYPE_INT32, UINT64_MAX);
    expect_reject(&t, CORRAL_FORMAT, "array count");
    tb_free(&t);
}
END_TEST

START_TEST(test_unknown_tensor_type) {
    tbuf t = {0};
    tinfo a[] = {{"w", 1, {32}, 4, 0}}; /* 4 was Q4_2, removed from ggml */
    craft_tensors(&t, a, 1, 0, 128);
    expect_reject(&t, CORRAL_FORMAT, "unknown tensor type id 4");
    tb_free(&t);
    tinfo b[] = {{"w", 1, {32}, 1000, 0}};
    craft_tensors(&t, b, 1, 0, 128);
    expect_reject(&t, CORRAL_FORMAT, "unknown tensor type id 1000");
    tb_free(&t);
}
END_TEST

START_TEST(test_misaligned_offset) {
    tbuf t = {0};
    tinfo a[] = {{"a", 1, {4}, TENSOR_TYPE_F32, 0}, {"odd.weight", 1, {4}, TENSOR_TYPE_F32, 16}};
    craft_tensors(&t, a, 2, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "misaligned data offset");
    expect_reject(&t, CORRAL_FORMAT, "tensor 'odd.weight'");
    tb_free(&t);
    /* The same offsets are fine with general.alignment 16. */
    craft_tensors(&t, a, 2, 16, 64);
    expect_accept(&t);
    tb_free(&t);
}
END_TEST

START_TEST(test_bad_alignment) {
    tbuf t = {0};
    tinfo a[] = {{"a", 1, {4}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, a, 1, 24, 64);
    expect_reject(&t, CORRAL_FORMAT, "power of two");
    expect_reject(&t, CORRAL_FORMAT, "general.alignment");
    tb_free(&t);
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.alignment", GGUF_TYPE_UINT32);
    tb_le(&t, 0, 4);
    expect_reject(&t, CORRAL_FORMAT, "power of two");
    tb_free(&t);
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.alignment", GGUF_TYPE_UINT64);
    tb_le(&t, 32, 8);
    expect_reject(&t, CORRAL_FORMAT, "uint32");
    tb_free(&t);
}
END_TEST

START_TEST(test_string_past_end) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.name", GGUF_TYPE_STRING);
    tb_le(&t, 1000, 8);
    tb_put(&t, "abc", 3);
    expect_reject(&t, CORRAL_FORMAT, "string length 1000");
    expect_reject(&t, CORRAL_FORMAT, "general.name");
    tb_free(&t);
    /* A key whose own length runs past the end. */
    tb_header(&t, 3, 0, 1);
    tb_le(&t, UINT64_MAX, 8);
    tb_put(&t, "general.name....", 16);
    expect_reject(&t, CORRAL_FORMAT, "string length");
    tb_free(&t);
    /* A tensor name. */
    tb_header(&t, 3, 1, 0);
    tb_le(&t, 5000, 8);
    tb_fill(&t, 40);
    expect_reject(&t, CORRAL_FORMAT, "tensor name");
    tb_free(&t);
}
END_TEST

START_TEST(test_duplicate_key) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 3);
    tb_key(&t, "general.name", GGUF_TYPE_STRING);
    tb_str(&t, "one");
    tb_key(&t, "general.other", GGUF_TYPE_UINT32);
    tb_le(&t, 1, 4);
    tb_key(&t, "general.name", GGUF_TYPE_UINT32);
    tb_le(&t, 2, 4);
    expect_reject(&t, CORRAL_FORMAT, "duplicate key");
    expect_reject(&t, CORRAL_FORMAT, "general.name");
    tb_free(&t);
}
END_TEST

START_TEST(test_duplicate_tensor_name) {
    tbuf t = {0};
    tinfo a[] = {{"blk.0.w", 1, {8}, TENSOR_TYPE_F32, 0},
                 {"blk.1.w", 1, {8}, TENSOR_TYPE_F32, 32},
                 {"blk.0.w", 1, {8}, TENSOR_TYPE_F32, 64}};
    craft_tensors(&t, a, 3, 0, 96);
    expect_reject(&t, CORRAL_FORMAT, "duplicate tensor name");
    expect_reject(&t, CORRAL_FORMAT, "blk.0.w");
    tb_free(&t);
}
END_TEST

START_TEST(test_overlapping_tensors) {
    tbuf t = {0};
    /* "b" starts inside "a" (listed in the other order, so sorting is needed to see it). */
    tinfo a[] = {{"b", 1, {16}, TENSOR_TYPE_F32, 32}, {"a", 1, {16}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, a, 2, 0, 128);
    expect_reject(&t, CORRAL_FORMAT, "overlap");
    expect_reject(&t, CORRAL_FORMAT, "'a'");
    expect_reject(&t, CORRAL_FORMAT, "'b'");
    tb_free(&t);
    /* Touching is not overlapping; empty tensors overlap nothing. */
    tinfo ok[] = {{"a", 1, {8}, TENSOR_TYPE_F32, 0},
                  {"b", 1, {8}, TENSOR_TYPE_F32, 32},
                  {"e", 1, {0}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, ok, 3, 0, 64);
    expect_accept(&t);
    tb_free(&t);
}
END_TEST

START_TEST(test_bad_bool) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.flag", GGUF_TYPE_BOOL);
    tb_le(&t, 2, 1);
    expect_reject(&t, CORRAL_FORMAT, "bad bool value 2");
    expect_reject(&t, CORRAL_FORMAT, "general.flag");
    tb_free(&t);
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "flags", GGUF_TYPE_ARRAY);
    tb_array(&t, GGUF_TYPE_BOOL, 3);
    tb_le(&t, 0, 1);
    tb_le(&t, 1, 1);
    tb_le(&t, 255, 1);
    expect_reject(&t, CORRAL_FORMAT, "bad bool value 255");
    tb_free(&t);
}
END_TEST

START_TEST(test_bad_n_dims) {
    tbuf t = {0};
    tinfo zero[] = {{"scalar", 0, {0}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, zero, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "n_dims 0");
    expect_reject(&t, CORRAL_FORMAT, "tensor 'scalar'");
    tb_free(&t);
    tinfo five[] = {{"five", 5, {1, 1, 1, 1, 1}, TENSOR_TYPE_F32, 0}};
    craft_tensors(&t, five, 1, 0, 64);
    expect_reject(&t, CORRAL_FORMAT, "n_dims 5");
    tb_free(&t);
}
END_TEST

START_TEST(test_unknown_value_type) {
    tbuf t = {0};
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.mystery", 13);
    tb_le(&t, 0, 8);
    expect_reject(&t, CORRAL_FORMAT, "unknown metadata value type 13");
    expect_reject(&t, CORRAL_FORMAT, "general.mystery");
    tb_free(&t);
    tb_header(&t, 3, 0, 1);
    tb_key(&t, "general.list", GGUF_TYPE_ARRAY);
    tb_array(&t, 99, 1);
    tb_le(&t, 0, 8);
    expect_reject(&t, CORRAL_FORMAT, "unknown metadata array element type 99");
    tb_free(&t);
}
END_TEST

START_TEST(test_builder_rejects_bad_input) {
    corral_error err;
    gguf_builder *b = gguf_builder_new();
    float x[64] = {0};
    ck_assert_int_eq(gguf_builder_add_tensor(b, "q", TENSOR_TYPE_Q4_0, 1, (int64_t[]){33}, x, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "block size"));
    ck_assert_int_eq(gguf_builder_add_tensor(b, "u", 4, 1, (int64_t[]){8}, x, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "unknown tensor type"));
    ck_assert_int_eq(gguf_builder_add_tensor(b, "d", TENSOR_TYPE_F32, 0, (int64_t[]){8}, x, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "n", TENSOR_TYPE_F32, 1, (int64_t[]){-8}, x, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "a", TENSOR_TYPE_F32, 1, (int64_t[]){8}, x, &err),
                     CORRAL_OK);
    ck_assert_int_eq(gguf_builder_add_tensor(b, "a", TENSOR_TYPE_F32, 1, (int64_t[]){8}, x, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "duplicate"));
    ck_assert_int_eq(gguf_builder_set_array(b, "s", GGUF_TYPE_STRING, x, 1),
                     CORRAL_INVALID_ARGUMENT);
    uint8_t bad_bools[] = {0, 2};
    ck_assert_int_eq(gguf_builder_set_array(b, "b", GGUF_TYPE_BOOL, bad_bools, 2),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(gguf_builder_set_str(b, NULL, "x"), CORRAL_INVALID_ARGUMENT);

    /* A bad alignment fails the write and leaves no file behind. */
    ck_assert_int_eq(gguf_builder_set_u32(b, "general.alignment", 24), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, tmp_path("bad.gguf"), &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "power of two"));
    ck_assert_int_eq(tmp_count_prefix("bad.gguf"), 0);
    ck_assert_int_eq(gguf_builder_set_u32(b, "general.alignment", 64), CORRAL_OK);
    ck_assert_int_eq(gguf_builder_write(b, "/nonexistent-dir/x.gguf", &err), CORRAL_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "/nonexistent-dir/x.gguf"));
    gguf_builder_destroy(&b);
}
END_TEST

/* Truncations and random corruption of a real file: the reader must succeed or fail with a
 * message, never crash, overread (each attempt uses an exactly-sized buffer) or leak. */
START_TEST(test_fuzz_stories) {
    size_t size;
    uint8_t *orig = read_whole(test_shared_path("models/stories260K.gguf"), &size);
    corral_error err;
    gguf_file *f = gguf_open_buffer(orig, size, "stories", &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    size_t header = (size_t)gguf_data_offset(f);
    gguf_destroy(&f);

    /* 300 cuts over the whole file, 300 more over the header and metadata. */
    for (int pass = 0; pass < 2; pass++) {
        size_t span = pass == 0 ? size : header;
        for (size_t k = 0; k < 300; k++) {
            size_t len = span * k / 300;
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, orig, len);
            f = gguf_open_buffer(cut, len, "cut", &err);
            ck_assert_msg(f == NULL, "truncated to %zu bytes yet accepted", len);
            ck_assert_int_eq(err.status, CORRAL_FORMAT);
            ck_assert_uint_gt(strlen(err.message), 0);
            free(cut);
        }
    }

    uint8_t *buf = malloc(size);
    memcpy(buf, orig, size);
    int accepted = 0;
    for (int iter = 0; iter < 4000; iter++) {
        size_t pos[4];
        int n = 1 + (int)(rng_next() % 4);
        for (int j = 0; j < n; j++) {
            pos[j] = (size_t)(rng_next() % header);
            buf[pos[j]] = (uint8_t)rng_next();
        }
        corral_error_clear(&err);
        f = gguf_open_buffer(buf, size, "fuzz", &err);
        if (f) {
            /* Whatever was accepted must be safe to walk. */
            accepted++;
            char text[128];
            for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
                gguf_format_value(f, i, text, sizeof text);
                gguf_array_str(f, i, 0);
            }
            for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
                const gguf_tensor *t = gguf_tensor_at(f, i);
                ck_assert_uint_le(gguf_data_offset(f) + t->offset + t->size, size);
            }
            uint32_t u32;
            gguf_get_u32(f, "llama.block_count", &u32, &err);
            gguf_destroy(&f);
        } else {
            ck_assert_int_ne(err.status, CORRAL_OK);
            ck_assert_uint_gt(strlen(err.message), 0);
        }
        for (int j = n - 1; j >= 0; j--) buf[pos[j]] = orig[pos[j]];
    }
    /* Many flips land in token text or values and are harmless; both outcomes must occur. */
    ck_assert_int_gt(accepted, 0);
    ck_assert_int_lt(accepted, 4000);
    free(buf);
    free(orig);
}
END_TEST

static Suite *gguf_suite(void) {
    Suite *s = suite_create("gguf");
    TCase *core = tcase_create("core");
    tcase_add_unchecked_fixture(core, tmp_dir_setup, tmp_dir_teardown);
    tcase_add_test(core, test_open_every_shared_file);
    tcase_add_test(core, test_stories_metadata);
    tcase_add_test(core, test_stories_f16_matches_f32);
    tcase_add_test(core, test_tensor_types_listing);
    tcase_add_test(core, test_builder_round_trip);
    tcase_add_test(core, test_builder_copies_real_model);
    tcase_add_test(core, test_crafted_valid_file_opens);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_unchecked_fixture(limits, tmp_dir_setup, tmp_dir_teardown);
    tcase_add_test(limits, test_empty_file_opens);
    tcase_add_test(limits, test_large_file_mapped_aligned);
    tcase_add_test(limits, test_advise_pages);
    tcase_add_test(limits, test_open_streamed_advised_from_the_start);
    tcase_add_test(limits, test_empty_strings);
    tcase_add_test(limits, test_huge_string_array);
    tcase_add_test(limits, test_alignment_extremes);
    tcase_add_test(limits, test_nesting_limit);
    tcase_add_test(limits, test_integer_conversion_edges);
    tcase_add_test(limits, test_format_value_small_buffers);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_unchecked_fixture(errors, tmp_dir_setup, tmp_dir_teardown);
    tcase_add_test(errors, test_truncated_everywhere);
    tcase_add_test(errors, test_wrong_magic);
    tcase_add_test(errors, test_legacy_v1_refused);
    tcase_add_test(errors, test_other_versions_refused);
    tcase_add_test(errors, test_file_system_errors);
    tcase_add_test(errors, test_data_past_end);
    tcase_add_test(errors, test_absurd_dimensions);
    tcase_add_test(errors, test_absurd_counts);
    tcase_add_test(errors, test_unknown_tensor_type);
    tcase_add_test(errors, test_misaligned_offset);
    tcase_add_test(errors, test_bad_alignment);
    tcase_add_test(errors, test_string_past_end);
    tcase_add_test(errors, test_duplicate_key);
    tcase_add_test(errors, test_duplicate_tensor_name);
    tcase_add_test(errors, test_overlapping_tensors);
    tcase_add_test(errors, test_bad_bool);
    tcase_add_test(errors, test_bad_n_dims);
    tcase_add_test(errors, test_unknown_value_type);
    tcase_add_test(errors, test_builder_rejects_bad_input);
    tcase_add_test(errors, test_fuzz_stories);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(gguf_suite)
