/*
 * utf8.h — corral's one UTF-8 codec (RFC 3629, Unicode's "well-formed UTF-8").
 *
 * Every part that reads or writes UTF-8 goes through here: the sanitizers and the regex compiler,
 * the JSON readers and writers, the tokenizer's decoders, the messages that leave the daemon.
 * Decoding is strict by default: no overlong forms (C0 80, E0 80 80, F0 80 80 80), no surrogates
 * (ED A0 80 .. ED BF BF), nothing above U+10FFFF (F4 90 80 80 and up, F5..FF), no stray
 * continuation bytes. An ill-formed stretch is measured as its "maximal subpart" (Unicode §3.9,
 * the WHATWG Encoding Standard): the longest prefix that could still have begun a well-formed
 * sequence, at least one byte — exactly the bytes one U+FFFD replaces when text is repaired, so
 * every repairing reader in corral agrees on where the replacement characters go.
 *
 * A reader that must reproduce another program's reading of ill-formed text (the tokenizer
 * follows llama.cpp, which accepts overlong forms and surrogates) asks for that with the
 * UTF8_ALLOW_* relaxations rather than carrying its own decoder.
 *
 * Everything here is pure: no allocation, no global state, thread-safe.
 */
#ifndef CORRAL_UTF8_H
#define CORRAL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_MAX_CODEPOINT 0x10FFFFu /* the last Unicode code point */
#define UTF8_REPLACEMENT   0xFFFDu   /* U+FFFD REPLACEMENT CHARACTER */
#define UTF8_SEQUENCE_MAX  4         /* the longest encoding of a code point, in bytes */

/* What utf8_decode found at the start of a buffer. */
typedef enum utf8_status {
    UTF8_OK = 0,         /* a well-formed sequence */
    UTF8_INVALID = -1,   /* an ill-formed one: a byte that cannot start or continue it */
    UTF8_TRUNCATED = -2, /* the buffer ends inside a sequence that is well-formed so far */
} utf8_status;

/* Relaxations of the decoding rules, or-ed together; 0 is strict UTF-8. */
enum {
    UTF8_ALLOW_OVERLONG = 1u << 0,  /* C0 80, E0 80 80, F0 80 80 80, ...: decode to their value */
    UTF8_ALLOW_SURROGATE = 1u << 1, /* U+D800..U+DFFF: decode (ED A0 80 ..) and encode */
};

/* 1 if b is a continuation byte (10xxxxxx). */
static inline bool utf8_is_continuation(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

/* The length a sequence announces in the high bits of its first byte: 1 for 00-7F, 2 for C0-DF,
 * 3 for E0-EF, 4 for F0-F7; 0 for bytes that announce nothing (continuation bytes 80-BF, and
 * F8-FF). This is the shape only: C0, C1 and F5-F7 announce a length but never begin a
 * well-formed sequence (utf8_decode tells). */
size_t utf8_lead_length(uint8_t b);

/* The number of bytes cp takes in UTF-8: 1 below U+0080, 2 below U+0800, 3 below U+10000, 4 up
 * to U+10FFFF; 0 above. Surrogates count 3, the length of their (ill-formed) encoding. */
size_t utf8_codepoint_length(uint32_t cp);

/* Decode the code point at the start of s[0..n). Strict (see the top of this file).
 *   UTF8_OK:        *cp is the code point, *len the length of its sequence (1-4).
 *   UTF8_INVALID:   *len is the length of the maximal subpart (1-3), the bytes to skip or to
 *                   replace with one U+FFFD; *cp is untouched.
 *   UTF8_TRUNCATED: the n bytes are a well-formed start that the buffer cuts short; *len = n
 *                   (0 when n is 0). A stream keeps them for the next buffer; a whole text
 *                   treats them as ill-formed, one U+FFFD for the n bytes.
 * cp may be NULL. */
utf8_status utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, size_t *len);

/* utf8_decode with the relaxations in `allow` (UTF8_ALLOW_*). With UTF8_ALLOW_OVERLONG, C0 and
 * C1 start two-byte sequences and E0 / F0 take any continuation byte second; with
 * UTF8_ALLOW_SURROGATE, ED does. Nothing above U+10FFFF is ever accepted. Maximal subparts are
 * measured under the relaxed rules. */
utf8_status utf8_decode_relaxed(const uint8_t *s, size_t n, uint32_t allow, uint32_t *cp,
                                size_t *len);

/* Encode the scalar value cp (U+0000..U+10FFFF, not a surrogate) into out. Returns its length
 * (1-4), or 0 — writing nothing — for a surrogate or a value above U+10FFFF. */
size_t utf8_encode(uint32_t cp, uint8_t out[UTF8_SEQUENCE_MAX]);

/* utf8_encode with the relaxations in `allow`: with UTF8_ALLOW_SURROGATE, U+D800..U+DFFF are
 * written as their three bytes (ED A0 80 ..), which only a UTF8_ALLOW_SURROGATE reader takes back.
 * Returns 0 above U+10FFFF. */
size_t utf8_encode_relaxed(uint32_t cp, uint32_t allow, uint8_t out[UTF8_SEQUENCE_MAX]);

/* The offset of the first byte of the first ill-formed sequence in s[0..n) (a truncated one at
 * the end counts), or n when all of it is well-formed UTF-8. */
size_t utf8_validate(const uint8_t *s, size_t n);

/* The largest k <= max such that s[0..k) does not end inside a well-formed sequence of s[0..n):
 * where to cut a name or a message to at most max bytes without splitting a character. Returns n
 * when n <= max. Ill-formed bytes count as one-byte units, so cutting never makes valid text
 * invalid, and never drops more than three bytes below max. */
size_t utf8_cut(const uint8_t *s, size_t n, size_t max);

/* Write s[0..n) into out[0..cap) as text that is always valid UTF-8: well-formed sequences as they
 * are, each byte of an ill-formed one as the four characters \xhh (lower-case hex, as corral's
 * logs and messages spell bytes). For echoing untrusted bytes in a message, not a reversible
 * encoding (a backslash stays a backslash). A NUL byte is escaped too (\x00), so the result is
 * one whole C string. Only whole characters and whole escapes are written, so a cut result is
 * valid UTF-8 as well; out is NUL-terminated when cap > 0. Returns the length the whole result
 * needs, without the NUL, like snprintf: the output was cut when the result is >= cap. out may be
 * NULL when cap is 0. */
size_t utf8_escape(char *out, size_t cap, const uint8_t *s, size_t n);

#endif /* CORRAL_UTF8_H */
