/*
 * swap.h — conversation state on disk: session KV caches written to the swap directory when
 * memory is needed, and read back when the conversation continues.
 *
 * Only state that exists nowhere else is written out: a session's KV cache (and the token ids it
 * holds). Model weights are never written: they are a mapping of a file already on disk (the GGUF
 * file, or a merged/repacked image), so evicting them is an unmap and bringing them back an mmap.
 *
 * A session image is a corral image (engine/include/corral/image.h): a GGUF file of kind
 * "kv-session" whose tensors are the token ids ("tokens", I32) and each layer's keys and values
 * ("k.N", "v.N", in the cache's own type, one row per position held: every position for a full
 * layer, the newest ones for a sliding-window layer, kv_cache_layer_first), with a checksum per tensor and a
 * fingerprint of everything the cache depends on (the identity of the model file as the model
 * that computed the cache loaded it — model_file_fingerprint —, the context and KV type, the app,
 * the session id, the model name). A model file replaced or changed after the cache was computed
 * therefore loads as a model whose caches are other ones, even if the image is written after the
 * change. It is written atomically (temporary file, fsync, rename), so a crash leaves the old
 * image or the new one, never a torn one. Reading it back checks the version, the kind, the fingerprint and every checksum; an image that fails any
 * of them is deleted and the conversation simply starts again from its text (the client sends the
 * whole conversation each turn), so a bad image costs time, never correctness.
 *
 * File names are session-<16 hex digits>.gguf, a hash of (app, session id): ids are client
 * strings and never become paths. The directory is created with mode 0700.
 */
#ifndef CORRAL_DAEMON_SWAP_H
#define CORRAL_DAEMON_SWAP_H

#include <stdbool.h>
#include <stdint.h>

#include "corral/model.h"
#include "corral/status.h"

typedef struct swap_dir swap_dir;

/* What swap_dir_open found in the directory. */
typedef struct swap_scan_report {
    uint32_t temp_removed;   /* leftovers of writes that died (a crash, kill -9) */
    uint32_t images_kept;    /* intact session images, usable by their sessions */
    uint32_t images_removed; /* corrupt, foreign or expired images, deleted */
} swap_scan_report;

/* Open (creating it and its missing parents, mode 0700) the swap directory at path; remove leftover
 * temporary files; verify every session image and delete the bad ones and those not used for
 * max_age_ms (the session time-to-live). A directory that cannot be created or written is not an
 * error: the result then reports !swap_dir_writable and the caller drops state instead of swapping
 * it (with a warning). NULL only when out of memory. Caller owns the result. */
swap_dir *swap_dir_open(const char *path, int64_t max_age_ms, swap_scan_report *report);

/* NULL-safe; sets *d to NULL. */
void swap_dir_destroy(swap_dir **d);

bool swap_dir_writable(const swap_dir *d);
const char *swap_dir_path(const swap_dir *d);

/* The identity of a session's state: who owns it and what produced its cache. */
typedef struct swap_session_key {
    const char *app;               /* "" for the default app */
    const char *session;           /* the client's session id */
    const char *model_name;        /* the configured model name */
    const char *model_fingerprint; /* model_file_fingerprint of the model (never ""
                                      for a write or a read: its caches cannot be kept) */
    uint32_t context;              /* KV positions of the cache */
    int kv_f32;                    /* cache element type */
} swap_session_key;

/* Write the session's cache (positions [0, n) and their token ids) as an image. Errors (the
 * directory unwritable or full, ...) name the path; the caller then drops the state. */
corral_status swap_session_write(swap_dir *d, const swap_session_key *key, const kv_cache *kv,
                                 const int32_t *tokens, uint32_t n, corral_error *err);

/* Whether an image exists for (key->app, key->session). */
bool swap_session_exists(const swap_dir *d, const swap_session_key *key);

/* Read a session image into kv (which must have key->context positions) and *tokens (malloc'ed
 * in the caller's allocation scope; *n positions). On success the image is deleted (its state now
 * lives in memory). On failure (missing, stale, corrupt) the image is deleted too and err says
 * why; kv is left empty. */
corral_status swap_session_read(swap_dir *d, const swap_session_key *key, kv_cache *kv,
                                int32_t **tokens, uint32_t *n, corral_error *err);

/* Whether an image that an earlier corrald left (one the opening scan kept) holds a session named
 * `session` of an app other than `app`, still on disk and within the session time-to-live (an
 * older one is deleted here). Sessions of this run are the caller's to know. */
bool swap_session_held_elsewhere(swap_dir *d, const char *session, const char *app);

/* Delete the image of (key->app, key->session), if any. */
void swap_session_discard(swap_dir *d, const swap_session_key *key);

#endif /* CORRAL_DAEMON_SWAP_H */
