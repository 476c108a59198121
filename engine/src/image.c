/*
 * image.c — corral images: fingerprints, checksummed GGUF writing, verified reading, and LRU
 * trimming of image directories (contract and file format in corral/image.h).
 */
#include "corral/image.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/tensor.h"

#include <xxhash.h>

/* ---- the hash ----------------------------------------------------------------------------------
 *
 * XXH3 (64-bit) from Debian's libxxhash: the maintained reference implementation, with the SIMD
 * paths its authors tune, rather than a copy of the algorithm kept here (image.h says why XXH3).
 */
uint64_t image_hash64(const void *data, size_t n, uint64_t seed) {
    return XXH3_64bits_withSeed(data, n, seed);
}

/* A little-endian uint64 at p (any alignment): the stored checksums. */
static inline uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- fingerprints ---------------------------------------------------------------------------- */

/* Item tags: an item is hashed as its tag and length, then its bytes, each chained through the
 * state, so that items of different types or splits never produce the same sequence. */
enum { FP_BYTES = 1, FP_STR = 2, FP_NULL = 3, FP_U64 = 4, FP_F32 = 5, FP_FILE = 6 };

static void fp_item(image_fingerprint *fp, uint32_t tag, const void *data, size_t n) {
    uint8_t head[16];
    for (unsigned i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)tag >> (8 * i));
    for (unsigned i = 0; i < 8; i++) head[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    fp->state = image_hash64(head, sizeof head, fp->state);
    fp->state = image_hash64(data, n, fp->state);
}

void image_fingerprint_init(image_fingerprint *fp, const char *domain) {
    fp->state = 0;
    image_fingerprint_add_str(fp, domain);
}

void image_fingerprint_add_bytes(image_fingerprint *fp, const void *data, size_t n) {
    fp_item(fp, FP_BYTES, n ? data : "", n);
}

void image_fingerprint_add_str(image_fingerprint *fp, const char *s) {
    if (!s) {
        fp_item(fp, FP_NULL, "", 0);
        return;
    }
    fp_item(fp, FP_STR, s, strlen(s));
}

void image_fingerprint_add_u64(image_fingerprint *fp, uint64_t v) {
    uint8_t b[8];
    for (unsigned i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    fp_item(fp, FP_U64, b, sizeof b);
}

void image_fingerprint_add_f32(image_fingerprint *fp, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t b[4];
    for (unsigned i = 0; i < 4; i++) b[i] = (uint8_t)(bits >> (8 * i));
    fp_item(fp, FP_F32, b, sizeof b);
}

/* Reads exactly n bytes at offset; false on a short read or an error. */
static bool pread_all(int fd, void *buf, size_t n, off_t offset) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, offset);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        offset += r;
    }
    return true;
}

/* Whether the first bytes of a file are those of a corral image: a GGUF header whose metadata
 * holds IMAGE_KEY_VERSION with its length prefix (the image writer sets it first, so it is within
 * the first kilobytes of any image). A model whose own metadata holds that string reads as an
 * image: its fingerprint then leaves the change time out, as it did before change times counted. */
static bool looks_like_image(const uint8_t *head, size_t n) {
    static const char key[] = IMAGE_KEY_VERSION;
    const size_t klen = sizeof key - 1;
    if (n < 4 || memcmp(head, "GGUF", 4) != 0) return false;
    for (size_t i = 8; i + klen <= n; i++) {
        if (head[i - 8] != klen || memcmp(head + i, key, klen) != 0) continue;
        bool prefix = true; /* the uint64 length, little-endian: klen, then seven zero bytes */
        for (size_t b = 1; b < 8; b++) prefix = prefix && head[i - 8 + b] == 0;
        if (prefix) return true;
    }
    return false;
}

corral_status image_fingerprint_add_file(image_fingerprint *fp, const char *path,
                                         corral_error *err) {
    if (!fp || !path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "image_fingerprint_add_file: NULL argument");
    }
    char abs[PATH_MAX];
    if (!realpath(path, abs)) {
        int e = errno;
        return corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s: %s", path,
                                strerror(e));
    }
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO,
                                "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return corral_error_set(err, CORRAL_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    size_t head_n = size < IMAGE_FILE_EDGE_BYTES ? (size_t)size : IMAGE_FILE_EDGE_BYTES;
    size_t tail_n = head_n;
    uint8_t *buf = malloc(IMAGE_FILE_EDGE_BYTES);
    if (!buf) {
        close(fd);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    bool ok = pread_all(fd, buf, head_n, 0);
    uint64_t head_hash = ok ? image_hash64(buf, head_n, 0) : 0;
    const bool is_image = ok && looks_like_image(buf, head_n);
    ok = ok && pread_all(fd, buf, tail_n, (off_t)(size - tail_n));
    uint64_t tail_hash = ok ? image_hash64(buf, tail_n, 0) : 0;
    int e = errno;
    free(buf);
    close(fd);
    if (!ok) return corral_error_set(err, CORRAL_IO, "%s: cannot read: %s", path, strerror(e));

    image_fingerprint f = *fp;
    fp_item(&f, FP_FILE, "", 0);
    image_fingerprint_add_str(&f, abs);
    image_fingerprint_add_u64(&f, size);
    image_fingerprint_add_u64(&f, (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
                                      (uint64_t)st.st_mtim.tv_nsec);
    image_fingerprint_add_u64(&f, (uint64_t)st.st_ino);
    image_fingerprint_add_u64(&f, head_hash);
    image_fingerprint_add_u64(&f, tail_hash);
    /* The change time too, but for corral's own images, which image_touch touches on every use
     * (a merged model is the input of its repacked weights' image): see image.h. */
    if (!is_image) {
        image_fingerprint_add_u64(&f, (uint64_t)st.st_ctim.tv_sec * 1000000000ull +
                                          (uint64_t)st.st_ctim.tv_nsec);
    }
    *fp = f;
    return CORRAL_OK;
}

void image_fingerprint_hex(const image_fingerprint *fp, char out[IMAGE_FINGERPRINT_CHARS + 1]) {
    snprintf(out, IMAGE_FINGERPRINT_CHARS + 1, "%016" PRIx64, fp->state);
}

/* ---- file stamps ----------------------------------------------------------------------------- */

static image_file_stamp stamp_of(const struct stat *st) {
    return (image_file_stamp){.dev = (uint64_t)st->st_dev,
                              .ino = (uint64_t)st->st_ino,
                              .size = (uint64_t)st->st_size,
                              .mtime_s = (int64_t)st->st_mtim.tv_sec,
                              .mtime_ns = (int64_t)st->st_mtim.tv_nsec,
                              .ctime_s = (int64_t)st->st_ctim.tv_sec,
                              .ctime_ns = (int64_t)st->st_ctim.tv_nsec};
}

corral_status image_file_stamp_read(const char *path, image_file_stamp *out, corral_error *err) {
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        const int e = path ? errno : EINVAL;
        *out = (image_file_stamp){0};
        return corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s: %s",
                                path ? path : "(null)", strerror(e));
    }
    *out = stamp_of(&st);
    return CORRAL_OK;
}

image_file_change image_file_stamp_compare(const image_file_stamp *then, const char *path,
                                           char *why, size_t why_size) {
    char scratch[8];
    if (!why) {
        why = scratch;
        why_size = sizeof scratch;
    }
    if (why_size) why[0] = '\0';
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(why, why_size, "gone (%s)", strerror(errno));
        return IMAGE_FILE_REPLACED;
    }
    const image_file_stamp now = stamp_of(&st);
    if (now.dev != then->dev || now.ino != then->ino) {
        snprintf(why, why_size, "replaced by another file (inode %" PRIu64 " -> %" PRIu64 ")",
                 then->ino, now.ino);
        return IMAGE_FILE_REPLACED;
    }
    if (now.size != then->size) {
        snprintf(why, why_size, "size %" PRIu64 " -> %" PRIu64 " bytes", then->size, now.size);
        return IMAGE_FILE_MODIFIED;
    }
    if (now.mtime_s != then->mtime_s || now.mtime_ns != then->mtime_ns) {
        snprintf(why, why_size, "modified in place (same size, modification time changed)");
        return IMAGE_FILE_MODIFIED;
    }
    if (now.ctime_s != then->ctime_s || now.ctime_ns != then->ctime_ns) {
        snprintf(why, why_size,
                 "changed in place (same size and modification time, change time "
                 "moved: written with its times put back, or its attributes "
                 "changed)");
        return IMAGE_FILE_MODIFIED;
    }
    return IMAGE_FILE_SAME;
}

/* ---- writing --------------------------------------------------------------------------------- */

/* One tensor of the image: where its bytes come from and, once written, their checksum. Each is
 * allocated on its own, since the builder keeps a pointer to it as the fill callback's `user`. */
typedef struct writer_tensor {
    const void *data; /* or: */
    gguf_tensor_fill_fn fill;
    void *user;
    uint64_t checksum;
    bool done;
} writer_tensor;

struct image_writer {
    gguf_builder *b;
    writer_tensor **tensors;
    size_t n_tensors, cap_tensors;
    uint64_t *sizes; /* parallel to tensors: byte size, for tensors added from memory */
    const corral_progress *pace; /* image_writer_set_pace; NULL: none */
    bool written;
};

void image_writer_set_pace(image_writer *w, const corral_progress *pace) {
    if (!w) return;
    w->pace = pace;
    gguf_builder_set_pace(w->b, pace);
}

static bool is_fingerprint(const char *s) {
    if (!s || strlen(s) != IMAGE_FINGERPRINT_CHARS) return false;
    for (const char *p = s; *p; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    }
    return true;
}

image_writer *image_writer_new(const char *kind, const char *fingerprint, corral_error *err) {
    if (!kind || !*kind) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_writer_new: empty kind");
        return NULL;
    }
    if (!is_fingerprint(fingerprint)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                         "image_writer_new: fingerprint '%s' is not %d lower-case hex digits",
                         fingerprint ? fingerprint : "(null)", IMAGE_FINGERPRINT_CHARS);
        return NULL;
    }
    image_writer *w = calloc(1, sizeof *w);
    if (w) w->b = gguf_builder_new();
    if (!w || !w->b || gguf_builder_set_u32(w->b, IMAGE_KEY_VERSION, IMAGE_VERSION) != CORRAL_OK ||
        gguf_builder_set_str(w->b, IMAGE_KEY_KIND, kind) != CORRAL_OK ||
        gguf_builder_set_str(w->b, IMAGE_KEY_FINGERPRINT, fingerprint) != CORRAL_OK) {
        image_writer_destroy(&w);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "image_writer_new: out of memory");
        return NULL;
    }
    return w;
}

void image_writer_destroy(image_writer **wp) {
    if (!wp || !*wp) return;
    image_writer *w = *wp;
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i]);
    free(w->tensors);
    free(w->sizes);
    gguf_builder_destroy(&w->b);
    free(w);
    *wp = NULL;
}

gguf_builder *image_writer_builder(image_writer *w) {
    return w ? w->b : NULL;
}

/* The builder's fill callback for every filled tensor: produce the bytes with the caller's fill,
 * then checksum them while they are hot in the cache. */
static corral_status writer_fill(void *user, const char *name, void *dst, uint64_t size,
                                 corral_error *err) {
    writer_tensor *t = user;
    corral_status st = t->fill(t->user, name, dst, size, err);
    if (st != CORRAL_OK) return st;
    t->checksum = image_hash64(dst, (size_t)size, 0);
    t->done = true;
    return CORRAL_OK;
}

static corral_status writer_add(image_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                const int64_t *ne, const void *data, gguf_tensor_fill_fn fill,
                                void *user, corral_error *err) {
    if (!w || w->written) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_writer_add_tensor: %s writer",
                                w ? "already written" : "NULL");
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        writer_tensor **t = realloc(w->tensors, cap * sizeof *t);
        if (t) w->tensors = t;
        uint64_t *s = t ? realloc(w->sizes, cap * sizeof *s) : NULL;
        if (s) w->sizes = s;
        if (!t || !s) {
            return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory",
                                    name ? name : "?");
        }
        w->cap_tensors = cap;
    }
    writer_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tensor '%s': out of memory",
                                name ? name : "?");
    }
    t->data = data;
    t->fill = fill;
    t->user = user;
    corral_status st =
        fill ? gguf_builder_add_tensor_fill(w->b, name, type, n_dims, ne, writer_fill, t, err)
             : gguf_builder_add_tensor(w->b, name, type, n_dims, ne, data, err);
    if (st != CORRAL_OK) {
        free(t);
        return st;
    }
    /* The builder accepted the shape, so its byte size is well defined and fits. */
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    uint64_t bytes = (uint64_t)(ne[0] / tt->block_size) * tt->type_size;
    for (uint32_t d = 1; d < n_dims; d++) bytes *= (uint64_t)ne[d];
    w->sizes[w->n_tensors] = bytes;
    w->tensors[w->n_tensors++] = t;
    return CORRAL_OK;
}

corral_status image_writer_add_tensor(image_writer *w, const char *name, uint32_t type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      corral_error *err) {
    return writer_add(w, name, type, n_dims, ne, data, NULL, NULL, err);
}

corral_status image_writer_add_tensor_fill(image_writer *w, const char *name, uint32_t type,
                                           uint32_t n_dims, const int64_t *ne,
                                           gguf_tensor_fill_fn fill, void *user,
                                           corral_error *err) {
    if (!fill) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "image_writer_add_tensor_fill: tensor '%s': NULL fill function",
                                name ? name : "?");
    }
    return writer_add(w, name, type, n_dims, ne, NULL, fill, user, err);
}

static void fsync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* best effort: the file itself is already on disk */
        close(fd);
    }
    free(dir);
}

/* File offset of the uint64 elements of the checksum array in the (complete, valid) file at
 * path: the reader gives the key's bytes inside its mapping; the value follows as uint32 type
 * (ARRAY), uint32 element type (UINT64), uint64 count, elements. */
static corral_status checksums_offset(const char *path, uint64_t n, uint64_t *offset,
                                      corral_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return err ? err->status : CORRAL_IO;
    int64_t kv = gguf_find_key(f, IMAGE_KEY_CHECKSUMS);
    gguf_type et;
    uint64_t count;
    corral_status st = CORRAL_INTERNAL;
    if (kv >= 0 && gguf_get_array(f, IMAGE_KEY_CHECKSUMS, &et, &count, NULL) == CORRAL_OK &&
        et == GGUF_TYPE_UINT64 && count == n) {
        gguf_str key = gguf_kv_key(f, (uint64_t)kv);
        *offset = (uint64_t)(key.data - (const char *)gguf_file_data(f)) + key.len + 4 + 4 + 8;
        st = CORRAL_OK;
    } else {
        corral_error_set(err, CORRAL_INTERNAL, "%s: checksum array not found after writing", path);
    }
    gguf_destroy(&f);
    return st;
}

corral_status image_writer_write(image_writer *w, const char *path, corral_error *err) {
    if (!w || !path) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_writer_write: NULL argument");
    }
    if (w->written) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s: image writer used twice", path);
    }
    w->written = true;
    size_t n = w->n_tensors;
    uint64_t *sums = calloc(n ? n : 1, sizeof *sums);
    if (!sums) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", path);
    /* A placeholder of the right length: the header's layout must not change when the real
     * checksums are patched in. */
    corral_status st =
        gguf_builder_set_array(w->b, IMAGE_KEY_CHECKSUMS, GGUF_TYPE_UINT64, sums, (uint64_t)n);
    if (st != CORRAL_OK) {
        free(sums);
        return corral_error_set(err, st, "%s: out of memory", path);
    }
    char part[PATH_MAX];
    /* The process id and a per-process counter: two threads (or processes) writing the same
     * image at once never share a temporary; the last rename wins, and both files are whole. */
    static atomic_uint_fast64_t part_counter;
    uint64_t serial = (uint64_t)atomic_fetch_add(&part_counter, 1);
    int len = snprintf(part, sizeof part, "%s.part.%ld.%" PRIu64, path, (long)getpid(), serial);
    if (len < 0 || (size_t)len >= sizeof part) {
        free(sums);
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s: path too long", path);
    }
    st = gguf_builder_write(w->b, part, err);
    if (st != CORRAL_OK) {
        free(sums);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        const writer_tensor *t = w->tensors[i];
        corral_progress_pace(w->pace);
        if (t->fill) {
            /* A tensor of zero bytes is never filled: its checksum is that of no bytes. */
            sums[i] = t->done ? t->checksum : image_hash64("", 0, 0);
        } else {
            sums[i] = image_hash64(t->data ? t->data : "", (size_t)w->sizes[i], 0);
        }
    }
    uint64_t offset = 0;
    st = checksums_offset(part, (uint64_t)n, &offset, err);
    int fd = st == CORRAL_OK ? open(part, O_WRONLY | O_CLOEXEC) : -1;
    bool ok = fd >= 0;
    int e = errno;
    if (ok && n > 0) {
        uint8_t *bytes = malloc(n * 8);
        ok = bytes != NULL;
        for (size_t i = 0; ok && i < n; i++) {
            for (unsigned k = 0; k < 8; k++) bytes[8 * i + k] = (uint8_t)(sums[i] >> (8 * k));
        }
        for (size_t done = 0; ok && done < n * 8;) {
            ssize_t wr = pwrite(fd, bytes + done, n * 8 - done, (off_t)(offset + done));
            if (wr < 0 && errno == EINTR) continue;
            if (wr <= 0) {
                ok = false;
                e = errno;
                break;
            }
            done += (size_t)wr;
        }
        free(bytes);
    }
    if (ok && fsync(fd) != 0) {
        ok = false;
        e = errno;
    }
    /* The bytes are on disk: let their pages go from the page cache. The pages a write leaves
     * there are small ones, and a mapping of them stays 4 KiB page by page for as long as they
     * are cached; read back afresh (gguf.c maps large files 2 MiB-aligned, and the weights'
     * reader advises them streamed), the kernel can hold and map them in 2 MiB pages. On a
     * 2-core VM a decode step over a repacked TinyLlama Q4_0 ran at 45-54 tok/s from the pages
     * the write left and at 79-80 from pages read back (README, engine speed); the cost is one
     * read of the image after it is made. */
    if (ok) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(part, path) != 0) {
        ok = false;
        e = errno;
    }
    free(sums);
    if (!ok) {
        unlink(part);
        if (st != CORRAL_OK) return st;
        return corral_error_set(err, CORRAL_IO, "%s: cannot write: %s", path, strerror(e));
    }
    fsync_dir_of(path);
    return CORRAL_OK;
}

/* ---- reading --------------------------------------------------------------------------------- */

struct image {
    gguf_file *f;
    char *path;
    char kind[128];
    char fingerprint[IMAGE_FINGERPRINT_CHARS + 1];
    uint64_t *checksums; /* [gguf_tensor_count] */
};

static const char *const image_problem_names[IMAGE_PROBLEM_COUNT] = {
    [IMAGE_PROBLEM_NONE] = "none",
    [IMAGE_PROBLEM_MISSING] = "missing",
    [IMAGE_PROBLEM_UNREADABLE] = "unreadable",
    [IMAGE_PROBLEM_MALFORMED] = "malformed",
    [IMAGE_PROBLEM_NOT_IMAGE] = "not an image",
    [IMAGE_PROBLEM_VERSION] = "wrong version",
    [IMAGE_PROBLEM_KIND] = "wrong kind",
    [IMAGE_PROBLEM_FINGERPRINT] = "stale fingerprint",
    [IMAGE_PROBLEM_CHECKSUM] = "checksum mismatch",
};

const char *image_problem_name(image_problem p) {
    return (unsigned)p < IMAGE_PROBLEM_COUNT ? image_problem_names[p] : "?";
}

static void set_problem(image_problem *out, image_problem p) {
    if (out) *out = p;
}

void image_destroy(image **imp) {
    if (!imp || !*imp) return;
    image *im = *imp;
    gguf_destroy(&im->f);
    free(im->path);
    free(im->checksums);
    free(im);
    *imp = NULL;
}

/* Copies a string value into dst (NUL-terminated); false when absent, not a string or too long. */
static bool read_str(const gguf_file *f, const char *key, char *dst, size_t cap) {
    gguf_str s;
    if (gguf_get_str(f, key, &s, NULL) != CORRAL_OK || s.len >= cap) return false;
    memcpy(dst, s.data, (size_t)s.len);
    dst[s.len] = '\0';
    return memchr(dst, '\0', (size_t)s.len) == NULL;
}

/* Fails the open: frees the half-built image and fills the problem and the error. */
static image *open_fail(image *im, image_problem *problem, image_problem p, corral_error *err,
                        corral_status status, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static image *open_fail(image *im, image_problem *problem, image_problem p, corral_error *err,
                        corral_status status, const char *fmt, ...) {
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    corral_error_set(err, status, "image %s: %s: %s", im->path, image_problem_name(p), msg);
    set_problem(problem, p);
    image_destroy(&im);
    return NULL;
}

image *image_open(const char *path, const char *kind, const char *fingerprint, image_verify verify,
                  image_problem *problem, corral_error *err) {
    set_problem(problem, IMAGE_PROBLEM_NONE);
    if (!path) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_open: path is NULL");
        set_problem(problem, IMAGE_PROBLEM_MISSING);
        return NULL;
    }
    image *im = calloc(1, sizeof *im);
    if (im) im->path = strdup(path);
    if (!im || !im->path) {
        free(im);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "image %s: out of memory", path);
        set_problem(problem, IMAGE_PROBLEM_UNREADABLE);
        return NULL;
    }
    corral_error gerr;
    im->f = gguf_open_streamed(path, &gerr);
    if (!im->f) {
        image_problem p = gerr.status == CORRAL_NOT_FOUND ? IMAGE_PROBLEM_MISSING
                          : gerr.status == CORRAL_FORMAT  ? IMAGE_PROBLEM_MALFORMED
                                                          : IMAGE_PROBLEM_UNREADABLE;
        /* The GGUF reader's message already names the path. */
        set_problem(problem, p);
        corral_error_set(err, gerr.status, "image: %s: %s", image_problem_name(p), gerr.message);
        image_destroy(&im);
        return NULL;
    }
    const gguf_file *f = im->f;
    if (gguf_find_key(f, IMAGE_KEY_VERSION) < 0) {
        return open_fail(im, problem, IMAGE_PROBLEM_NOT_IMAGE, err, CORRAL_FAILED_PRECONDITION,
                         "no %s key: not a corral image", IMAGE_KEY_VERSION);
    }
    uint32_t version = 0;
    if (gguf_get_u32(f, IMAGE_KEY_VERSION, &version, NULL) != CORRAL_OK) {
        return open_fail(im, problem, IMAGE_PROBLEM_MALFORMED, err, CORRAL_FORMAT,
                         "%s is not a uint32", IMAGE_KEY_VERSION);
    }
    if (version != IMAGE_VERSION) {
        return open_fail(im, problem, IMAGE_PROBLEM_VERSION, err, CORRAL_UNSUPPORTED,
                         "image version %" PRIu32 ", this corral reads version %u", version,
                         IMAGE_VERSION);
    }
    if (!read_str(f, IMAGE_KEY_KIND, im->kind, sizeof im->kind) || !im->kind[0]) {
        return open_fail(im, problem, IMAGE_PROBLEM_MALFORMED, err, CORRAL_FORMAT,
                         "%s is missing or not a short string", IMAGE_KEY_KIND);
    }
    if (!read_str(f, IMAGE_KEY_FINGERPRINT, im->fingerprint, sizeof im->fingerprint) ||
        !is_fingerprint(im->fingerprint)) {
        return open_fail(im, problem, IMAGE_PROBLEM_MALFORMED, err, CORRAL_FORMAT,
                         "%s is missing or not %d hex digits", IMAGE_KEY_FINGERPRINT,
                         IMAGE_FINGERPRINT_CHARS);
    }
    if (kind && strcmp(kind, im->kind) != 0) {
        return open_fail(im, problem, IMAGE_PROBLEM_KIND, err, CORRAL_FAILED_PRECONDITION,
                         "kind '%s', wanted '%s'", im->kind, kind);
    }
    if (fingerprint && strcmp(fingerprint, im->fingerprint) != 0) {
        return open_fail(im, problem, IMAGE_PROBLEM_FINGERPRINT, err, CORRAL_FAILED_PRECONDITION,
                         "fingerprint %s, the inputs now give %s", im->fingerprint, fingerprint);
    }
    uint64_t n = gguf_tensor_count(f);
    gguf_type et;
    uint64_t count;
    int64_t kv = gguf_find_key(f, IMAGE_KEY_CHECKSUMS);
    if (kv < 0 || gguf_get_array(f, IMAGE_KEY_CHECKSUMS, &et, &count, NULL) != CORRAL_OK ||
        et != GGUF_TYPE_UINT64 || count != n) {
        return open_fail(im, problem, IMAGE_PROBLEM_MALFORMED, err, CORRAL_FORMAT,
                         "%s is missing or is not a uint64 array of %" PRIu64
                         " entries (one per tensor)",
                         IMAGE_KEY_CHECKSUMS, n);
    }
    im->checksums = malloc((n ? n : 1) * sizeof *im->checksums);
    if (!im->checksums) {
        return open_fail(im, problem, IMAGE_PROBLEM_UNREADABLE, err, CORRAL_OUT_OF_MEMORY,
                         "out of memory");
    }
    /* The reader validated the array's extent; its elements follow the key, the value type, the
     * element type and the count (see checksums_offset). */
    gguf_str key = gguf_kv_key(f, (uint64_t)kv);
    const uint8_t *elems = (const uint8_t *)key.data + key.len + 4 + 4 + 8;
    for (uint64_t i = 0; i < n; i++) im->checksums[i] = read_le64(elems + 8 * i);
    if (verify == IMAGE_VERIFY_FULL) {
        corral_error verr;
        if (image_verify_all(im, problem, &verr) != CORRAL_OK) {
            corral_error_set(err, verr.status, "%s", verr.message);
            image_destroy(&im);
            return NULL;
        }
    }
    return im;
}

const gguf_file *image_gguf(const image *im) {
    return im->f;
}

const char *image_get_kind(const image *im) {
    return im->kind;
}

const char *image_get_fingerprint(const image *im) {
    return im->fingerprint;
}

uint64_t image_tensor_checksum(const image *im, uint64_t i) {
    return i < gguf_tensor_count(im->f) ? im->checksums[i] : 0;
}

corral_status image_verify_tensor(const image *im, uint64_t i, image_problem *problem,
                                  corral_error *err) {
    set_problem(problem, IMAGE_PROBLEM_NONE);
    if (!im || i >= gguf_tensor_count(im->f)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "image_verify_tensor: tensor %" PRIu64 " out of range", i);
    }
    const gguf_tensor *t = gguf_tensor_at(im->f, i);
    uint64_t got = image_hash64(t->data, (size_t)t->size, 0);
    if (got != im->checksums[i]) {
        set_problem(problem, IMAGE_PROBLEM_CHECKSUM);
        return corral_error_set(err, CORRAL_FORMAT,
                                "image %s: checksum mismatch: tensor '%.*s' (%" PRIu64
                                " bytes) hashes to %016" PRIx64 ", the image says %016" PRIx64
                                ": the file is corrupt",
                                im->path, (int)(t->name.len > 96 ? 96 : t->name.len), t->name.data,
                                t->size, got, im->checksums[i]);
    }
    return CORRAL_OK;
}

corral_status image_verify_all(const image *im, image_problem *problem, corral_error *err) {
    set_problem(problem, IMAGE_PROBLEM_NONE);
    if (!im) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_verify_all: NULL image");
    for (uint64_t i = 0; i < gguf_tensor_count(im->f); i++) {
        corral_status st = image_verify_tensor(im, i, problem, err);
        if (st != CORRAL_OK) return st;
    }
    return CORRAL_OK;
}

/* ---- cache directories ----------------------------------------------------------------------- */

corral_status image_touch(const char *path, corral_error *err) {
    const struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}}; /* atime, mtime */
    if (utimensat(AT_FDCWD, path, times, 0) != 0) {
        int e = errno;
        return corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO,
                                "%s: cannot mark as used: %s", path, strerror(e));
    }
    return CORRAL_OK;
}

typedef struct trim_entry {
    char *name;
    uint64_t bytes;
    struct timespec used;
} trim_entry;

static int trim_entry_cmp(const void *a, const void *b) {
    const trim_entry *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A leftover of an interrupted write may be removed once it is this old: a write in progress
 * touches its temporary continuously, and none takes an hour. */
#define TRIM_TEMP_AGE_S 3600

/* The length of the prefix of `prefixes` ('|'-separated) that name starts with and that leaves at
 * least one more character; 0 when none does. */
static size_t trim_prefix_match(const char *name, size_t len, const char *prefixes) {
    for (const char *p = prefixes;;) {
        const char *bar = strchr(p, '|');
        const size_t plen = bar ? (size_t)(bar - p) : strlen(p);
        if (plen > 0 && len > plen && strncmp(name, p, plen) == 0) return plen;
        if (!bar) return 0;
        p = bar + 1;
    }
}

corral_status image_dir_trim(const char *dir, const char *prefix, uint64_t limit_bytes,
                             const char *keep, image_trim_report *rep, corral_error *err) {
    image_trim_report r = {0};
    if (!dir || !prefix) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "image_dir_trim: NULL argument");
    }
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return corral_error_set(err, e == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO,
                                "cache directory %s: %s", dir, strerror(e));
    }
    int dfd = dirfd(d);
    trim_entry *entries = NULL;
    size_t n = 0, cap = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    corral_status st = CORRAL_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        size_t len = strlen(name);
        const size_t prefix_len = trim_prefix_match(name, len, prefix);
        if (prefix_len == 0) continue;
        struct stat sb;
        if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (strstr(name + prefix_len, ".part.") || strstr(name + prefix_len, ".tmp.")) {
            if (now.tv_sec - sb.st_mtim.tv_sec > TRIM_TEMP_AGE_S && unlinkat(dfd, name, 0) == 0) {
                r.n_removed++;
                r.bytes_removed += (uint64_t)sb.st_size;
            }
            continue;
        }
        if (len < prefix_len + 5 || strcmp(name + len - 5, ".gguf") != 0) continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            trim_entry *grown = realloc(entries, ncap * sizeof *grown);
            if (!grown) {
                st = corral_error_set(err, CORRAL_OUT_OF_MEMORY,
                                      "cache directory %s: out of memory", dir);
                break;
            }
            entries = grown;
            cap = ncap;
        }
        entries[n].name = strdup(name);
        if (!entries[n].name) {
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cache directory %s: out of memory",
                                  dir);
            break;
        }
        entries[n].bytes = (uint64_t)sb.st_size;
        bool accessed_later =
            sb.st_atim.tv_sec > sb.st_mtim.tv_sec ||
            (sb.st_atim.tv_sec == sb.st_mtim.tv_sec && sb.st_atim.tv_nsec > sb.st_mtim.tv_nsec);
        entries[n].used = accessed_later ? sb.st_atim : sb.st_mtim;
        n++;
    }
    if (st == CORRAL_OK) {
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) total += entries[i].bytes;
        if (n > 1)
            qsort(entries, n, sizeof *entries, trim_entry_cmp); /* entries is NULL when n == 0 */
        for (size_t i = 0; i < n; i++) {
            bool kept = total <= limit_bytes || (keep && strcmp(entries[i].name, keep) == 0);
            if (!kept) {
                if (unlinkat(dfd, entries[i].name, 0) == 0 || errno == ENOENT) {
                    total -= entries[i].bytes;
                    r.n_removed++;
                    r.bytes_removed += entries[i].bytes;
                    continue;
                }
            }
            r.n_kept++;
            r.bytes_kept += entries[i].bytes;
        }
    }
    for (size_t i = 0; i < n; i++) free(entries[i].name);
    free(entries);
    closedir(d);
    if (rep) *rep = r;
    return st;
}
