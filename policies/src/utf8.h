/*
 * utf8.h — private to policies/: strict UTF-8 decoding (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF) with the WHATWG "maximal subpart" length for repair, and
 * encoding. Header-only; every function is pure.
 */
#ifndef CORRAL_POLICIES_UTF8_H
#define CORRAL_POLICIES_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decode one code point from s[0..n) (n >= 1). Returns the length (1-4) of a well-formed sequence
 * and sets *cp; or, for ill-formed input, minus the length of its maximal subpart (the longest
 * prefix that could start a well-formed sequence, at least 1): the bytes one U+FFFD replaces. */
static inline int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    const uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int need;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        v = b0 & 0x1Fu;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        v = b0 & 0x0Fu;
        if (b0 == 0xE0) lo = 0xA0; /* overlong */
        if (b0 == 0xED) hi = 0x9F; /* surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        v = b0 & 0x07u;
        if (b0 == 0xF0) lo = 0x90; /* overlong */
        if (b0 == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return -1; /* a continuation byte, C0, C1 or F5..FF */
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        const uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -i;
        v = (v << 6) | (b & 0x3Fu);
    }
    *cp = v;
    return need + 1;
}

/* Encode cp (a scalar value <= U+10FFFF) into out; returns 1-4. */
static inline int utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

#endif /* CORRAL_POLICIES_UTF8_H */
