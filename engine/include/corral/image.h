/*
 * image.h — corral images: GGUF files that corral writes for itself (merged LoRA models, swapped
 * out model state) and must be able to trust when it reads them back.
 *
 * An image is an ordinary GGUF file (model_load and `corral inspect` read it like any other)
 * with four metadata keys that say what it is and whether it is still good:
 *   1. corral.image.version      uint32, IMAGE_VERSION. Another value: written by another corral;
 *                                 the image is not used.
 *   2. corral.image.kind         string naming what the image holds ("merged-model", ...), so that
 *                                 one kind is never taken for another.
 *   3. corral.image.fingerprint  string of 16 lower-case hex digits: a 64-bit hash over the
 *                                 identity of everything the image was made from (see
 * "Fingerprints" below). A reader that computes a different fingerprint for its inputs today knows
 * the image is stale.
 *   4. corral.image.checksums    uint64 array, one entry per tensor in file order: the checksum of
 *                                 that tensor's bytes (image_hash64 with seed 0, over exactly the
 *                                 tensor's `size` bytes, padding excluded). A mismatch means the
 *                                 bytes on disk are not the bytes that were written: corrupt.
 *
 * The hash. image_hash64 is XXH3, 64-bit (Yann Collet's xxHash, 0.8), from Debian's libxxhash:
 * SIMD stripes of 64 bytes, tens of GB/s on one core, far faster than the disk, and every
 * corruption that matters here (torn writes, flipped bits, truncation, stray edits) caught with
 * probability 1 - 2^-64; it is not a cryptographic hash and does not defend against an attacker
 * who can write the cache directory (who could as well write the model). Version 1 images used
 * XXH64, which took 1.6-2x as long to check a cached variant (docs/performance.md); a version
 * 1 image is "wrong version", so it is made again from its inputs, as any stale image is.
 * test_image.c checks the hash against XXH3's published vectors.
 *
 * Writing. image_writer wraps gguf_builder: metadata and tensors are added as with the builder,
 * tensors either from memory or produced by a fill callback at write time (so an image of any size
 * is written holding one tensor at a time). The checksums are computed as the bytes go out, but
 * the header that holds them is written first; so the file is written under a temporary name
 * ("<path>.part.<pid>", itself written atomically by the builder), the checksum array is patched
 * into its header in place, the file is fsync'ed and then renamed over `path`. A reader therefore
 * sees at `path` either nothing, an older complete image, or the new complete one.
 *
 * Fingerprints. image_fingerprint hashes a sequence of typed items (each length-prefixed and
 * tagged, so "ab"+"c" and "a"+"bc" differ). For a file the item is its identity, not its whole
 * contents (hashing a 4 GB base model on every load would cost seconds): the absolute path
 * (realpath), the size, the modification and change times in nanoseconds, the inode number, and
 * the hash of its first and last 64 KiB. Rewriting, replacing (even by a file of the same size and
 * edges with its modification time set back: another inode, a new change time), truncating or
 * touching an input therefore changes the fingerprint; parameters (adapter scales, ...) are
 * added as items of their own. The change time cannot be set back by a user; it also moves when a
 * file is renamed or its mode changes, which costs one remake of the images made from it. It is
 * left out for corral's own images (the file starts with an image header): image_touch marks
 * them used on every use, and a merged model is the input of another image.
 *
 * File stamps. image_file_stamp is what stat(2) says about a file (device, inode, size,
 * modification and change times): taken when a file is mapped, and compared with the file as it
 * is now before the mapping is used again, it tells a file that is still the one mapped from one
 * that was rewritten or truncated in place (the mapping now shows other bytes, or none) and from
 * one that was replaced at its path (the mapping still holds the old file, which is intact).
 *
 * Thread-safety: the functions are reentrant; an image handle is immutable after image_open and
 * may be shared by threads; a writer belongs to one thread.
 */
#ifndef CORRAL_IMAGE_H
#define CORRAL_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "corral/gguf.h"
#include "corral/status.h"

#define IMAGE_VERSION           2u
#define IMAGE_KEY_VERSION       "corral.image.version"
#define IMAGE_KEY_KIND          "corral.image.kind"
#define IMAGE_KEY_FINGERPRINT   "corral.image.fingerprint"
#define IMAGE_KEY_CHECKSUMS     "corral.image.checksums"
/* Hex digits of a fingerprint (the string form has one more byte, the NUL). */
#define IMAGE_FINGERPRINT_CHARS 16
/* Bytes hashed at each end of a file by image_fingerprint_add_file. */
#define IMAGE_FILE_EDGE_BYTES   (64u * 1024u)

/* XXH3-64 of n bytes at data with the given seed. Pure function: thread-safe. */
uint64_t image_hash64(const void *data, size_t n, uint64_t seed);

/* ---- fingerprints ---------------------------------------------------------------------------- */

/* A fingerprint being computed. Plain value: no resources, copyable. */
typedef struct image_fingerprint {
    uint64_t state;
} image_fingerprint;

/* Start a fingerprint. `domain` (e.g. "lora-merge-1") is hashed first, so that fingerprints made
 * for different purposes, or by different versions of an algorithm, never collide. */
void image_fingerprint_init(image_fingerprint *fp, const char *domain);

/* Add an item: bytes, a NUL-terminated string (NULL counts as a distinct "null" item), an
 * integer, a float (by its bit pattern: 0.5 and 0.50000006 differ). */
void image_fingerprint_add_bytes(image_fingerprint *fp, const void *data, size_t n);
void image_fingerprint_add_str(image_fingerprint *fp, const char *s);
void image_fingerprint_add_u64(image_fingerprint *fp, uint64_t v);
void image_fingerprint_add_f32(image_fingerprint *fp, float v);

/* Add the identity of the file at path (see the file comment). Errors: CORRAL_NOT_FOUND when it
 * does not exist, CORRAL_IO when it cannot be read or is not a regular file; the message names
 * the path. On error *fp is unchanged. */
corral_status image_fingerprint_add_file(image_fingerprint *fp, const char *path,
                                         corral_error *err);

/* The fingerprint as 16 lower-case hex digits and a NUL. */
void image_fingerprint_hex(const image_fingerprint *fp, char out[IMAGE_FINGERPRINT_CHARS + 1]);

/* ---- file stamps ----------------------------------------------------------------------------- */

/* A file's identity as stat(2) gives it (see the file comment). Plain value. */
typedef struct image_file_stamp {
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns, ctime_s, ctime_ns;
} image_file_stamp;

/* How a file compares with a stamp taken earlier. */
typedef enum image_file_change {
    IMAGE_FILE_SAME = 0,     /* every field equal: the same file, untouched */
    IMAGE_FILE_MODIFIED = 1, /* the same inode, but its size or times changed: rewritten,
                                truncated or touched in place (a mapping of it may now show
                                other bytes, or fault) */
    IMAGE_FILE_REPLACED = 2, /* another file at the path, or none: a mapping of the old one still
                                holds the old, intact bytes */
} image_file_change;

/* The stamp of the file at path now. CORRAL_NOT_FOUND / CORRAL_IO naming the path when it cannot
 * be read (stat). */
corral_status image_file_stamp_read(const char *path, image_file_stamp *out, corral_error *err);

/* Compare the file at path now with `then`. When it changed, why (may be NULL) gets what changed,
 * e.g. "size 1048576 -> 524288 bytes" or "replaced by another file (inode 12 -> 40)" or "gone
 * (No such file or directory)", NUL-terminated within why_size. Only stat(2): no reading. */
image_file_change image_file_stamp_compare(const image_file_stamp *then, const char *path,
                                           char *why, size_t why_size);

/* ---- writing --------------------------------------------------------------------------------- */

typedef struct image_writer image_writer;

/* An image of the given kind and fingerprint (both copied; kind non-empty, fingerprint 16 hex
 * digits, else CORRAL_INVALID_ARGUMENT). Caller owns the result (image_writer_destroy). NULL with
 * err set on failure. */
image_writer *image_writer_new(const char *kind, const char *fingerprint, corral_error *err);

/* NULL-safe; sets *w to NULL. */
void image_writer_destroy(image_writer **w);

/* The builder underneath, for metadata only (gguf_builder_set_*, gguf_builder_copy_kv): tensors
 * must be added with image_writer_add_tensor*, which keep their checksums, and the corral.image.*
 * keys belong to the writer. Borrowed: valid until the writer is destroyed. */
gguf_builder *image_writer_builder(image_writer *w);

/* Add a tensor from memory (borrowed until image_writer_write returns) or produced at write time
 * by fill(user, ...): the same contracts as gguf_builder_add_tensor / _fill. */
corral_status image_writer_add_tensor(image_writer *w, const char *name, uint32_t type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      corral_error *err);
corral_status image_writer_add_tensor_fill(image_writer *w, const char *name, uint32_t type,
                                           uint32_t n_dims, const int64_t *ne,
                                           gguf_tensor_fill_fn fill, void *user, corral_error *err);

/* Write the image to path atomically (see the file comment). A fill error or an I/O error leaves
 * no file at path (an older file there is kept) and no temporary behind. Once the bytes are on
 * disk their pages are dropped from the page cache, so that the first reader reads them afresh
 * (and the kernel can map them in 2 MiB pages). Call once per writer. */
corral_status image_writer_write(image_writer *w, const char *path, corral_error *err);

/* Pause points for image_writer_write (gguf_builder_set_pace), also between the checksums of
 * tensors; NULL: none. Borrowed until the write. */
void image_writer_set_pace(image_writer *w, const corral_progress *pace);

/* ---- reading --------------------------------------------------------------------------------- */

/* Why an image cannot be used. "Stale" problems (kind, fingerprint, version) mean the image is
 * intact but not the one wanted; "corrupt" ones (malformed, checksum) mean its bytes are bad. */
typedef enum image_problem {
    IMAGE_PROBLEM_NONE = 0,
    IMAGE_PROBLEM_MISSING = 1,     /* no file at the path */
    IMAGE_PROBLEM_UNREADABLE = 2,  /* the file exists but cannot be opened or mapped */
    IMAGE_PROBLEM_MALFORMED = 3,   /* not a valid GGUF file: truncated, garbled header */
    IMAGE_PROBLEM_NOT_IMAGE = 4,   /* a GGUF file without corral.image.* keys */
    IMAGE_PROBLEM_VERSION = 5,     /* corral.image.version is not IMAGE_VERSION */
    IMAGE_PROBLEM_KIND = 6,        /* another kind than the one asked for */
    IMAGE_PROBLEM_FINGERPRINT = 7, /* made from other inputs: stale */
    IMAGE_PROBLEM_CHECKSUM = 8,    /* a tensor's bytes do not match its checksum: corrupt */
    IMAGE_PROBLEM_COUNT
} image_problem;

/* "missing", "unreadable", "malformed", "not an image", "wrong version", "wrong kind",
 * "stale fingerprint", "checksum mismatch"; "none" for NONE; "?" outside the enum. Static. */
const char *image_problem_name(image_problem p);

/* How much image_open checks. */
typedef enum image_verify {
    IMAGE_VERIFY_METADATA = 0, /* the GGUF structure and the four keys; no tensor bytes read */
    IMAGE_VERIFY_FULL = 1,     /* and every tensor's checksum (reads the whole file) */
} image_verify;

typedef struct image image;

/* Map and check the image at path: valid GGUF, version, kind (when `kind` is not NULL),
 * fingerprint (when `fingerprint` is not NULL), a checksum per tensor, and with IMAGE_VERIFY_FULL
 * every checksum. Caller owns the result (image_destroy). NULL on failure, with *problem (may be
 * NULL) saying why and err a message naming the path and the problem: CORRAL_NOT_FOUND (missing),
 * CORRAL_IO (unreadable), CORRAL_FORMAT (malformed, checksum), CORRAL_UNSUPPORTED (version),
 * CORRAL_FAILED_PRECONDITION (not an image, kind, fingerprint). */
image *image_open(const char *path, const char *kind, const char *fingerprint, image_verify verify,
                  image_problem *problem, corral_error *err);

/* NULL-safe; unmaps the file; sets *im to NULL. */
void image_destroy(image **im);

/* The GGUF file underneath (tensors, metadata). Borrowed: valid until image_destroy. */
const gguf_file *image_gguf(const image *im);

/* The image's kind and fingerprint (NUL-terminated copies). Borrowed: valid until image_destroy. */
const char *image_get_kind(const image *im);
const char *image_get_fingerprint(const image *im);

/* The stored checksum of tensor i (i < gguf_tensor_count). */
uint64_t image_tensor_checksum(const image *im, uint64_t i);

/* Check tensor i's bytes against its checksum (reads that tensor only): CORRAL_OK, or
 * CORRAL_FORMAT naming the image and the tensor (and *problem = IMAGE_PROBLEM_CHECKSUM);
 * CORRAL_INVALID_ARGUMENT for i out of range. Thread-safe. */
corral_status image_verify_tensor(const image *im, uint64_t i, image_problem *problem,
                                  corral_error *err);

/* Check every tensor; the first mismatch is reported as by image_verify_tensor. */
corral_status image_verify_all(const image *im, image_problem *problem, corral_error *err);

/* ---- cache directories ----------------------------------------------------------------------- */

/* What image_dir_trim did. */
typedef struct image_trim_report {
    uint32_t n_kept, n_removed;
    uint64_t bytes_kept, bytes_removed;
} image_trim_report;

/* Keep a directory of images under a size limit, least recently used first out. The candidates
 * are the regular files in dir whose names start with `prefix` — or with any of several prefixes
 * separated by '|' ("lora-|repack-": one budget for both kinds) — and end in ".gguf"; their "last
 * use" is the later of their access and modification times. Image users set the access time
 * explicitly with image_touch on every use, because the kernel's own updates are unreliable (most
 * file systems are mounted relatime or noatime, which skip them); the modification time is left
 * alone, since an image may itself be the input of another image's fingerprint (a merged model
 * is the base of a repacked one), and touching it would make that one stale. While the
 * candidates' total size exceeds limit_bytes, the oldest is deleted, except `keep` (a file name
 * in dir, or NULL), which is never deleted. Leftover temporaries of writes that died (names with
 * the prefix containing ".part." or ".tmp.") older than an hour are removed too. rep may be NULL.
 * Errors: CORRAL_NOT_FOUND / CORRAL_IO for the directory, naming it; a file that vanishes
 * meanwhile (another process trimming) is not an error. */
corral_status image_dir_trim(const char *dir, const char *prefix, uint64_t limit_bytes,
                             const char *keep, image_trim_report *rep, corral_error *err);

/* Mark the file at path as used now, for image_dir_trim's LRU order: sets its access time (only:
 * the modification time, part of fingerprints, is unchanged). CORRAL_IO / CORRAL_NOT_FOUND naming
 * the path on failure. */
corral_status image_touch(const char *path, corral_error *err);

#endif /* CORRAL_IMAGE_H */
