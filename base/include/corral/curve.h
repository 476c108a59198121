/*
 * curve.h — CURVE keys as corral keeps them: z85 text (40 characters for 32 bytes, as
 * zmq_curve_keypair writes them) in small files, one key per file. Shared by corrald (its secret
 * key, the clients' public keys in its config) and the clients (the daemon's public key, their own
 * secret key), so that every part reads and checks a key file the same way.
 *
 * A key file holds the key on a line of its own; blank lines and lines starting with '#' are
 * comments (`corral keygen` writes one saying what the file is). A secret key file must not be
 * readable or writable by other users: it is refused, by name, when it is (`chmod 600 FILE`).
 *
 * Nothing here links ZeroMQ: checking and reading text needs none of it.
 */
#ifndef CORRAL_CURVE_H
#define CORRAL_CURVE_H

#include <stdbool.h>
#include <stddef.h>

#include "corral/status.h"

/* A key's text with its NUL. */
#define CURVE_KEY_TEXT  41
/* Bytes of a key. */
#define CURVE_KEY_BYTES 32

/* What a key file holds. */
typedef enum curve_key_kind {
    CURVE_KEY_PUBLIC = 1, /* may be read by anyone */
    CURVE_KEY_SECRET = 2, /* refused when other users may read or write the file */
} curve_key_kind;

/* Whether text is a key: exactly 40 characters of the Z85 alphabet, each group of 5 encoding a
 * value below 2^32. NULL gives false. Thread-safe. */
bool curve_key_valid(const char *text);

/* Decode a valid key into its 32 bytes. Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT when text is
 * not a key (curve_key_valid). Thread-safe. */
corral_status curve_key_decode(const char *text, unsigned char out[CURVE_KEY_BYTES]);

/* Encode 32 bytes as a key's text (NUL-terminated). Thread-safe. */
void curve_key_encode(const unsigned char key[CURVE_KEY_BYTES], char out[CURVE_KEY_TEXT]);

/* Read the key of file `path` into out (NUL-terminated). Returns CORRAL_OK; CORRAL_NOT_FOUND or
 * CORRAL_IO when it cannot be read; CORRAL_PERMISSION_DENIED for a secret key file that other users
 * may read or write (the message names the file, its mode and the chmod that fixes it);
 * CORRAL_INVALID_ARGUMENT when it is not a regular file of at most 4 KiB holding exactly one key.
 * Thread-safe. */
corral_status curve_key_read(const char *path, curve_key_kind kind, char out[CURVE_KEY_TEXT],
                             corral_error *err);

#endif /* CORRAL_CURVE_H */
