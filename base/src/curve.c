/*
 * curve.c — CURVE key text and key files (see curve.h).
 *
 * Z85 (ZeroMQ RFC 32) writes each 4 bytes as 5 characters of an 85-letter alphabet, most
 * significant first; a group whose value is 2^32 or more is not an encoding of anything.
 */
#include "corral/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";

/* The value of one Z85 character, or -1. */
static int z85_digit(char c) {
    if (c == '\0') return -1;
    const char *at = strchr(z85_alphabet, c);
    return at ? (int)(at - z85_alphabet) : -1;
}

corral_status curve_key_decode(const char *text, unsigned char out[CURVE_KEY_BYTES]) {
    if (!text || strlen(text) != CURVE_KEY_TEXT - 1) return CORRAL_INVALID_ARGUMENT;
    for (size_t group = 0; group < CURVE_KEY_BYTES / 4; group++) {
        uint64_t value = 0;
        for (size_t i = 0; i < 5; i++) {
            const int d = z85_digit(text[group * 5 + i]);
            if (d < 0) return CORRAL_INVALID_ARGUMENT;
            value = value * 85 + (uint64_t)d;
        }
        if (value > UINT32_MAX) return CORRAL_INVALID_ARGUMENT;
        for (size_t i = 0; i < 4; i++) out[group * 4 + i] = (unsigned char)(value >> (24 - 8 * i));
    }
    return CORRAL_OK;
}

void curve_key_encode(const unsigned char key[CURVE_KEY_BYTES], char out[CURVE_KEY_TEXT]) {
    for (size_t group = 0; group < CURVE_KEY_BYTES / 4; group++) {
        uint32_t value = 0;
        for (size_t i = 0; i < 4; i++) value = value << 8 | key[group * 4 + i];
        for (size_t i = 5; i-- > 0; value /= 85) out[group * 5 + i] = z85_alphabet[value % 85];
    }
    out[CURVE_KEY_TEXT - 1] = '\0';
}

bool curve_key_valid(const char *text) {
    unsigned char scratch[CURVE_KEY_BYTES];
    return curve_key_decode(text, scratch) == CORRAL_OK;
}

corral_status curve_key_read(const char *path, curve_key_kind kind, char out[CURVE_KEY_TEXT],
                             corral_error *err) {
    const char *what = kind == CURVE_KEY_SECRET ? "secret key file" : "public key file";
    out[0] = '\0';
    /* Non-blocking: a FIFO named as a key file must not hang the reader. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return corral_error_set(err, errno == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "%s %s: %s",
                                what, path, strerror(errno));
    enum { KEY_FILE_MAX = 4096 };
    struct stat st;
    corral_status status = CORRAL_OK;
    if (fstat(fd, &st) != 0)
        status = corral_error_set(err, CORRAL_IO, "%s %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        status = corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s %s is not a regular file", what,
                                  path);
    else if (kind == CURVE_KEY_SECRET && (st.st_mode & (S_IRWXO)))
        status = corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                  "%s %s has mode %03o: other users may read it, and anyone who "
                                  "reads it can pose as its owner (chmod 600 %s)",
                                  what, path, (unsigned)(st.st_mode & 0777), path);
    else if (st.st_size > KEY_FILE_MAX)
        status = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                  "%s %s is larger than %d bytes: not a key file", what, path,
                                  KEY_FILE_MAX);
    char text[KEY_FILE_MAX + 1];
    ssize_t len = 0;
    if (status == CORRAL_OK) {
        len = read(fd, text, KEY_FILE_MAX);
        if (len < 0)
            status = corral_error_set(err, CORRAL_IO, "%s %s: %s", what, path, strerror(errno));
    }
    close(fd);
    if (status != CORRAL_OK) return status;
    text[len] = '\0';
    /* One key line; blank lines and '#' comments around it. */
    size_t keys = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = '\0';
        while (*line == ' ' || *line == '\t') line++;
        if (!*line || *line == '#') continue;
        if (++keys > 1 || !curve_key_valid(line)) {
            out[0] = '\0';
            break;
        }
        memcpy(out, line, CURVE_KEY_TEXT);
    }
    if (keys != 1 || !out[0])
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "%s %s does not hold one CURVE key (a line of 40 z85 characters, "
                                "as `corral keygen` writes)",
                                what, path);
    return CORRAL_OK;
}
